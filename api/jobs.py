"""In-process runner of long plan searches ("jobs"), with progress and cancellation.

Job state lives in the database, so any server process can answer `GET /v1/jobs/{id}`
and accept a cancel; a thread of the process that accepted the request runs the search
(with `solve_in_processes`, the default, it waits for the search's child process and
reports progress four times a second). Cancelling works through the progress callback:
the next time it is called it raises `JobCancelled`, and the search unwinds (a child
process is killed, so even a search that never reports progress stops).

Status writes are retried through a database blip (about 30 s); progress writes are
skipped during one. Jobs are not resumed after a restart: a clean shutdown marks pending jobs `failed`
(`server_shutdown`). Every process touches its unfinished jobs every `HEARTBEAT_S`; a
job silent for `LOST_AFTER_S` belonged to a process that died, and is marked `failed`
(`server_lost`) when it is read or when a server starts.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy.exc import OperationalError

import planner
from api.errors import Overloaded, error_body
from api.metrics import Metrics
from api.services.planning import Solver, solve_and_store
from api.services.scenarios import Assembled
from api.storage import JobRecord, JobStatus, Store

__all__ = ["JobCancelled", "JobRunner"]

log = logging.getLogger("hetplan.jobs")

_PROGRESS_WRITE_S = 0.25
_CANCEL_POLL_S = 1.0
HEARTBEAT_S = 5.0
LOST_AFTER_S = 60.0  # twelve missed heartbeats: the owning process is gone
_WRITE_RETRY_DELAYS_S = (0.1, 0.2, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0)
"""About 30 s in all: enough for a database blip (a failover, a restart), not an outage."""

T = TypeVar("T")


def _through_blips(write: Callable[[], T]) -> T:
    """`write()`, retried while the database cannot be reached, for about 30 s: a job's
    status must not be lost (nor its thread killed) by a blip."""
    for delay_s in _WRITE_RETRY_DELAYS_S:
        try:
            return write()
        except OperationalError:
            log.warning("job status write failed; retrying in %.1f s", delay_s)
            time.sleep(delay_s)
    return write()


class JobCancelled(Exception):
    """Raised from a search's progress callback to stop a cancelled job."""


class _Progress:
    """The progress callback of one job: stores progress (throttled) and stops the search
    when the job is cancelled, here or from another process."""

    def __init__(self, store: Store, job_id: str, cancelled: threading.Event) -> None:
        self.store = store
        self.job_id = job_id
        self.cancelled = cancelled
        self.last_write = 0.0
        self.last_poll = time.monotonic()

    def __call__(self, fraction: float, message: str) -> None:
        now = time.monotonic()
        try:  # during a database blip the search goes on; progress is only news
            self._poll_and_write(now, fraction, message)
        except OperationalError:
            log.warning("job %s: could not read its cancel flag or write progress", self.job_id)
        if self.cancelled.is_set():
            raise JobCancelled(self.job_id)

    def _poll_and_write(self, now: float, fraction: float, message: str) -> None:
        if not self.cancelled.is_set() and now - self.last_poll >= _CANCEL_POLL_S:
            self.last_poll = now
            if self.store.get_job(self.job_id).cancel_requested:
                self.cancelled.set()
        if not self.cancelled.is_set() and now - self.last_write >= _PROGRESS_WRITE_S:
            self.last_write = now
            self.store.update_job(self.job_id, progress=min(max(float(fraction), 0.0), 1.0),
                                  message=str(message)[:500])


class JobRunner:
    def __init__(self, *, store: Store, solver: Solver, metrics: Metrics, workers: int,
                 max_pending: int) -> None:
        self.store = store
        self.solver = solver
        self.metrics = metrics
        self.max_pending = max_pending
        self.workers = workers
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="hetplan-solve")
        self._closed = False
        self._lock = threading.Lock()
        self._cancel: dict[str, threading.Event] = {}
        self._futures: set[Future[None]] = set()
        self._stop_heartbeat = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self._start_heartbeat()

    def _start_heartbeat(self) -> None:
        self._stop_heartbeat.clear()
        self._heartbeat = threading.Thread(target=self._beat_until_stopped,
                                           name="hetplan-job-heartbeat", daemon=True)
        self._heartbeat.start()

    def _beat_until_stopped(self) -> None:
        while not self._stop_heartbeat.wait(HEARTBEAT_S):
            self.beat()

    def beat(self) -> None:
        """Tell other processes this one still runs its unfinished jobs."""
        with self._lock:
            active = list(self._cancel)
        try:
            self.store.touch_jobs(active)
        except Exception:  # a database hiccup must not end the heartbeat
            log.warning("could not record the job heartbeat", exc_info=True)

    def fail_lost_jobs(self, job_id: str | None = None) -> int:
        """Fail unfinished jobs (one, or all) whose process stopped sending heartbeats."""
        lost = Overloaded("the server process running this plan job stopped before it "
                          "finished; request the plan again")
        silent_since = datetime.now(UTC) - timedelta(seconds=LOST_AFTER_S)
        return self.store.fail_silent_jobs(
            silent_since=silent_since, job_id=job_id,
            error={**error_body(lost), "error": "server_lost"})

    def get(self, job_id: str) -> JobRecord:
        """A job's record; one whose process died is failed first."""
        with self._lock:
            ours = job_id in self._cancel
        if not ours:
            self.fail_lost_jobs(job_id)
        return self.store.get_job(job_id)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._cancel)

    def submit(self, assembled: Assembled, options: planner.SearchOptions) -> JobRecord:
        """Queue a search; `Overloaded` when `max_pending` jobs are already waiting."""
        with self._lock:
            if len(self._cancel) >= self.max_pending:
                raise Overloaded(f"{len(self._cancel)} plan jobs are already pending on this "
                                 "server (max_pending_jobs); retry later or shorten "
                                 "options.time_limit_s to get an inline answer")
            job_id = uuid.uuid4().hex
            event = self._cancel[job_id] = threading.Event()
            self.metrics.queue_depth.set(len(self._cancel))
        try:
            job = self.store.add_job(job_id)
            future = self._pool.submit(self._run, job_id, assembled, options, event)
            with self._lock:
                self._futures.add(future)
            future.add_done_callback(self._futures.discard)
        except BaseException:
            self._forget(job_id)
            raise
        return job

    def cancel(self, job_id: str) -> JobRecord:
        """Ask a job to stop; a queued job is cancelled at once, a running one at its next
        progress report. Cancelling a finished job changes nothing."""
        job = self.store.get_job(job_id)
        if job.status.final:
            return job
        # record the request before waking the search, so the answer always shows it
        job = self.store.update_job(job_id, expect=JobStatus.QUEUED, status=JobStatus.CANCELLED,
                                    cancel_requested=True, message="cancelled")
        if not job.status.final:  # it was running (or started meanwhile)
            job = self.store.update_job(job_id, cancel_requested=True, message="cancelling")
        with self._lock:
            event = self._cancel.get(job_id)
        if event is not None:
            event.set()
        return job

    def start(self) -> None:
        """Take jobs again after `shutdown` (an app whose lifespan runs more than once)."""
        if self._closed:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="hetplan-solve")
            self._closed = False
            self._start_heartbeat()

    def shutdown(self, wait_s: float = 5.0) -> None:
        """Stop taking jobs: pending ones are marked failed (their searches die with the
        process, and a poller must not wait for them), running searches are asked to stop
        and given `wait_s` to unwind before the caller closes the database."""
        with self._lock:
            pending = dict(self._cancel)
        for job_id, event in pending.items():
            event.set()
            shutdown = Overloaded("the server shut down before this plan job finished; "
                                  "request the plan again")
            try:
                self.store.update_job(job_id, status=JobStatus.FAILED,
                                      error={**error_body(shutdown), "error": "server_shutdown"},
                                      message="server shut down")
            except Exception:  # the database may be gone too; the process is ending anyway
                log.warning("could not mark job %s failed at shutdown", job_id)
        self._stop_heartbeat.set()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._closed = True
        with self._lock:
            running = set(self._futures)
        wait(running, timeout=wait_s)

    def _run(self, job_id: str, assembled: Assembled, options: planner.SearchOptions,
             cancelled: threading.Event) -> None:
        def status(**changes: Any) -> None:
            _through_blips(lambda: self.store.update_job(job_id, **changes))

        try:
            if cancelled.is_set() or _through_blips(lambda: self.store.get_job(job_id)
                                                    ).status.final:
                status(status=JobStatus.CANCELLED, message="cancelled")
                return
            status(status=JobStatus.RUNNING, message="solving")
            record = solve_and_store(
                assembled, options, solver=self.solver, store=self.store,
                progress=_Progress(self.store, job_id, cancelled),
                observe=self.metrics.observe_solve)
            status(status=JobStatus.SUCCEEDED, progress=1.0, plan_id=record.id, message="done")
        except JobCancelled:
            status(status=JobStatus.CANCELLED, cancel_requested=True, message="cancelled")
        except Exception as error:
            if not isinstance(error, planner.PlannerError):
                log.exception("plan job %s failed", job_id)
            status(status=JobStatus.FAILED, error=error_body(error),
                   message=error_body(error)["message"][:500])
        finally:
            self._forget(job_id)

    def _forget(self, job_id: str) -> None:
        with self._lock:
            self._cancel.pop(job_id, None)
            self.metrics.queue_depth.set(len(self._cancel))
