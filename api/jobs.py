"""Durable jobs: long plan searches and sweeps queued in the database, run by workers.

    JobQueue  (API side)  submit -> a `queued` row holding the whole request; read; cancel
    Worker    (any process that reaches the database, any number of them)
        claim    the oldest queued job, or one whose lease lapsed, under a lease of `lease_s`
        renew    its jobs' leases every `lease_s / 3` (the heartbeat), and read their cancel
                 flags there: a cancelled job, or one another worker took, is stopped
        finish   write the outcome, only while it still owns the job

A job therefore survives the process that accepted it and the worker that ran it: when a
worker dies (kill -9, a lost machine) its leases lapse and another worker claims the job
again, at most `max_attempts` times in all; after that it fails, saying so
(`job_attempts_exhausted`). A worker that shuts down cleanly stops its searches and
queues their jobs again without counting the attempt.

Searches run through the `Solver` (by default a search process per search, which a stop
kills, `api.solving`), so a worker with `concurrency` N runs N searches at once. A job
whose search fails (infeasible, timeout, out of memory) fails with that error: running it
again would fail again. Status writes are retried through a database blip (about 30 s);
progress writes are skipped during one. Leases are compared with this machine's clock:
machines running workers keep their clocks in sync (NTP) to well under `lease_s`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar

from sqlalchemy.exc import OperationalError

import planner
from api.errors import Overloaded, error_body
from api.job_requests import run_request
from api.metrics import Metrics
from api.services.planning import Solver
from api.storage import ClaimedJob, JobKind, JobRecord, JobStatus, Store

__all__ = ["JobStopped", "JobQueue", "Worker", "exhausted_error", "worker_name"]

log = logging.getLogger("hetplan.jobs")

_PROGRESS_WRITE_S = 0.25
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


def exhausted_error(attempts: int) -> dict[str, Any]:
    """The error of a job whose workers all stopped before finishing it."""
    body = error_body(Overloaded(
        f"this job was started {attempts} times and each time the worker running it "
        "stopped before it finished (killed, out of memory, or its machine lost); request "
        "it again, perhaps with a smaller scenario or time limit"))
    return {**body, "error": "job_attempts_exhausted", "attempts": attempts}


class JobStopped(Exception):
    """Raised from a job's progress callback to stop its search: cancelled, lost to
    another worker, or its worker shutting down (`reason`)."""

    def __init__(self, job_id: str, reason: str) -> None:
        super().__init__(f"job {job_id}: {reason}")
        self.reason = reason



class JobQueue:
    """The API side of jobs: queue one (refused with 503 beyond `max_pending`
    unfinished jobs of the whole service), read one, cancel one."""

    def __init__(self, *, store: Store, max_pending: int,
                 on_submit: Callable[[], None] | None = None) -> None:
        self.store = store
        self.max_pending = max_pending
        self.on_submit = on_submit

    def submit(self, kind: JobKind, request: dict[str, Any]) -> JobRecord:
        """Queue a job; `Overloaded` when `max_pending` jobs are already unfinished."""
        pending = self.store.count_unfinished_jobs()
        if pending >= self.max_pending:
            raise Overloaded(f"{pending} jobs are already queued or running "
                             "(max_pending_jobs); retry later or shorten options.time_limit_s "
                             "to get an inline answer")
        job = self.store.add_job(uuid.uuid4().hex, kind=kind, request=request)
        if self.on_submit is not None:
            self.on_submit()  # an embedded worker need not wait for its next poll
        return job

    def get(self, job_id: str) -> JobRecord:
        return self.store.get_job(job_id)

    def cancel(self, job_id: str) -> JobRecord:
        """Ask a job to stop: a queued one is cancelled at once, a running one by its
        worker at the next heartbeat or progress report. A finished job is unchanged."""
        job = self.store.get_job(job_id)
        if job.status.final:
            return job
        job = self.store.update_job(job_id, expect=JobStatus.QUEUED, status=JobStatus.CANCELLED,
                                    cancel_requested=True, message="cancelled")
        if not job.status.final:  # it was running (or was claimed meanwhile)
            job = self.store.update_job(job_id, cancel_requested=True, message="cancelling")
        return job


class _Running:
    """One job a worker runs: the event that stops its search, and why."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.reason = ""

    def stop_for(self, reason: str) -> None:
        if not self.stop.is_set():
            self.reason = reason
            self.stop.set()


class _Progress:
    """A job's progress callback: stores progress (throttled), polls the cancel flag, and
    raises `JobStopped` once the job must stop."""

    def __init__(self, store: Store, job_id: str, owner: str, running: _Running,
                 poll_s: float) -> None:
        self.store, self.job_id, self.owner = store, job_id, owner
        self.running = running
        self.poll_s = poll_s
        self.last_write = 0.0
        self.last_poll = time.monotonic()

    def __call__(self, fraction: float, message: str) -> None:
        now = time.monotonic()
        try:  # during a database blip the search goes on; progress is only news
            self._poll(now)
            if not self.running.stop.is_set() and now - self.last_write >= _PROGRESS_WRITE_S:
                self.last_write = now
                self.store.update_job(self.job_id, owner=self.owner,
                                      progress=min(max(float(fraction), 0.0), 1.0),
                                      message=str(message)[:500])
        except OperationalError:
            log.warning("job %s: could not read its cancel flag or write progress", self.job_id)
        self.check()

    def check(self) -> None:
        """Raise `JobStopped` when the job must stop (the cancel flag is polled here too)."""
        with contextlib.suppress(OperationalError):  # a blip: the next call polls again
            self._poll(time.monotonic())
        if self.running.stop.is_set():
            raise JobStopped(self.job_id, self.running.reason)

    def _poll(self, now: float) -> None:
        if not self.running.stop.is_set() and now - self.last_poll >= self.poll_s:
            self.last_poll = now
            job = self.store.get_job(self.job_id)
            if job.cancel_requested:
                self.running.stop_for("cancelled")
            elif job.owner != self.owner or job.status.final:
                self.running.stop_for("lost")


def worker_name() -> str:
    """Who owns a claimed job: host, process and a random suffix (a restarted process
    with a reused pid is another owner)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Worker:
    """Claims jobs from the database and runs up to `concurrency` of them at once.

    `start()` runs it on background threads (the embedded worker of `hetplan serve`, and
    `hetplan worker`); `stop()` stops its searches and queues their jobs again."""

    def __init__(self, *, store: Store, solver: Solver, metrics: Metrics, concurrency: int,
                 lease_s: float = 30.0, poll_s: float = 1.0, max_attempts: int = 3,
                 name: str | None = None) -> None:
        self.store = store
        self.solver = solver
        self.metrics = metrics
        self.concurrency = concurrency
        self.lease_s = lease_s
        self.poll_s = poll_s
        self.max_attempts = max_attempts
        self.name = name or worker_name()
        self._lock = threading.Lock()
        self._running: dict[str, _Running] = {}
        self._slots = threading.Semaphore(concurrency)
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._pool: ThreadPoolExecutor | None = None
        self._futures: set[Future[None]] = set()
        self._claim_failing = False

    # -- life cycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Claim and run jobs on background threads until `stop()` (again after a stop)."""
        if self._pool is not None:
            return
        self._stopping.clear()
        self._slots = threading.Semaphore(self.concurrency)
        self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="hetplan-job")
        self._threads = [threading.Thread(target=target, name=name, daemon=True)
                         for target, name in ((self._claim_until_stopped, "hetplan-claim"),
                                              (self._beat_until_stopped, "hetplan-lease"))]
        for thread in self._threads:
            thread.start()

    def stop(self, wait_s: float = 5.0) -> None:
        """Stop claiming, stop the running searches (given `wait_s` to unwind), and queue
        their jobs again for another worker (or this one, restarted)."""
        if self._pool is None:
            return
        self._stopping.set()
        self._wake.set()
        with self._lock:
            running = dict(self._running)
            futures = set(self._futures)
        for job in running.values():
            job.stop_for("shutdown")
        wait(futures, timeout=wait_s)
        try:
            self.store.release_jobs(self.name, running)
        except Exception:  # the database may be gone too: the leases lapse instead
            log.warning("could not queue the jobs of this worker again at shutdown")
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool = None
        for thread in self._threads:
            thread.join(timeout=wait_s)

    def wake(self) -> None:
        """Look for a job now instead of at the next poll (a job was just queued)."""
        self._wake.set()

    @property
    def running(self) -> int:
        with self._lock:
            return len(self._running)

    # -- claiming ------------------------------------------------------------------------

    def _claim_until_stopped(self) -> None:
        while not self._stopping.is_set():
            if not self._slots.acquire(timeout=self.poll_s):
                continue
            claimed = self.claim()
            if claimed is None:
                self._slots.release()
                self._wake.wait(self.poll_s)
                self._wake.clear()

    def claim(self) -> ClaimedJob | None:
        """Claim one job and start running it; None when there was none to claim (or the
        database did not answer). The caller holds a slot, which the run gives back."""
        try:
            claimed = self.store.claim_job(owner=self.name, lease_s=self.lease_s,
                                           max_attempts=self.max_attempts,
                                           exhausted_error=exhausted_error)
        except Exception:  # a database hiccup must not end the claiming thread
            log.warning("could not claim a job", exc_info=not self._claim_failing)
            self._claim_failing = True  # the first failure in a row with its traceback
            return None
        self._claim_failing = False
        if claimed is None:
            return None
        running = _Running()
        with self._lock:
            self._running[claimed.job.id] = running
            self.metrics.queue_depth.set(len(self._running))
        pool = self._pool
        if pool is None or self._stopping.is_set():
            self._forget(claimed.job.id)
            self.store.release_jobs(self.name, [claimed.job.id])
            return None
        future = pool.submit(self._run, claimed, running)
        with self._lock:
            self._futures.add(future)
        future.add_done_callback(self._futures.discard)
        return claimed

    # -- the heartbeat -------------------------------------------------------------------

    def _beat_until_stopped(self) -> None:
        while not self._stopping.wait(self.lease_s / 3):
            self.beat()

    def beat(self) -> None:
        """Renew the leases of this worker's jobs; stop those cancelled or taken over."""
        with self._lock:
            running = dict(self._running)
        try:
            states = self.store.renew_leases(self.name, running, self.lease_s)
        except Exception:  # a blip: the leases hold for a while yet
            log.warning("could not renew the job leases", exc_info=True)
            return
        for job_id, state in states.items():
            if state.cancel_requested:
                running[job_id].stop_for("cancelled")
            elif not state.ours:
                running[job_id].stop_for("lost")

    # -- running -------------------------------------------------------------------------

    def _run(self, claimed: ClaimedJob, running: _Running) -> None:
        job = claimed.job

        def status(**changes: Any) -> None:
            _through_blips(lambda: self.store.update_job(job.id, owner=self.name, **changes))

        progress = _Progress(self.store, job.id, self.name, running, poll_s=1.0)
        try:
            try:
                outcome = run_request(job.kind, claimed.request, solver=self.solver,
                                      store=self.store, progress=progress,
                                      check=progress.check, observe=self.metrics.observe_solve)
            except JobStopped as stopped:
                if stopped.reason == "cancelled":
                    status(status=JobStatus.CANCELLED, cancel_requested=True,
                           message="cancelled")
                return  # lost: another worker owns it now; shutdown: `stop` queues it again
            except Exception as error:
                if not isinstance(error, planner.PlannerError):
                    log.exception("job %s failed", job.id)
                status(status=JobStatus.FAILED, error=error_body(error),
                       message=error_body(error)["message"][:500])
                return
            # a write still failing after the retries leaves the lease to lapse: another
            # worker then runs the job again
            status(status=JobStatus.SUCCEEDED, progress=1.0, plan_id=outcome.plan_id,
                   result=outcome.result, message="done")
        finally:
            self._forget(job.id)
            self._slots.release()
            self._wake.set()

    def _forget(self, job_id: str) -> None:
        with self._lock:
            self._running.pop(job_id, None)
            self.metrics.queue_depth.set(len(self._running))
