"""Jobs: status and progress of long searches and sweeps, and cancellation. Jobs live in
the database, so any API replica answers for any job, whichever worker runs it."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path

from api import schemas
from api.deps import PlanAuth, ReadAuth, RunnerDep
from api.errors import Conflict, ErrorResponses
from api.routing import CheckedRoute
from planner.errors import Problem

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=ErrorResponses.common,
                   route_class=CheckedRoute)

JobId = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[0-9a-f]+$")]


@router.get("/{job_id}", response_model=schemas.JobPublic, operation_id="get_job",
            responses=ErrorResponses.not_found, summary="Status and progress of a job")
def get(job_id: JobId, runner: RunnerDep, _: ReadAuth) -> Any:
    """When `status` is `succeeded`, a plan job's `plan_id` names the stored plan
    (GET /v1/plans/{id}) and a pareto or what-if job's `result` is its answer; when
    `failed`, `error` holds the same answer an inline request would have had
    (`job_attempts_exhausted` when every worker that started it stopped before finishing).
    A job whose worker stopped is taken over by another: `attempts` counts the starts."""
    return schemas.JobPublic.model_validate(runner.get(job_id), from_attributes=True)


@router.post("/{job_id}/cancel", status_code=202, response_model=schemas.JobPublic,
             operation_id="cancel_job",
             responses={**ErrorResponses.not_found, **ErrorResponses.conflict},
             summary="Cancel a job")
def cancel(job_id: JobId, runner: RunnerDep, _: PlanAuth) -> Any:
    """A queued job is cancelled at once; a running one stops within about a second, in
    whichever worker runs it (`status` stays `running` with `cancel_requested` until
    then). A job that has already ended cannot be cancelled: 409."""
    status = runner.get(job_id).status
    if status.final:
        raise Conflict(f"job {job_id} has already ended ({status.value}); only queued or "
                       "running jobs can be cancelled",
                       problems=[Problem(path="status", value=status.value,
                                         message="the job has ended; nothing to cancel")])
    return schemas.JobPublic.model_validate(runner.cancel(job_id), from_attributes=True)
