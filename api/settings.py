"""Operator settings of the service, read from `HETPLAN_*` environment variables.

Everything the service may vary by deployment lives here so that `create_app(settings)`
is the only way configuration enters the app: tests pass their own `Settings`, the
CLI and the container read the environment.
"""

from __future__ import annotations

import ipaddress
import os
from enum import StrEnum

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Scope", "Settings", "ExposureRefused", "check_exposure", "is_loopback"]


class Scope(StrEnum):
    """What a bearer token may do. Any valid token may read; `admin` may do everything."""

    UPLOAD = "upload"
    """Write measurements and catalogue entries: profiles, links, GPU types, models, clusters."""
    PLAN = "plan"
    """Request plans and evaluations, cancel plan jobs."""
    ADMIN = "admin"
    """Everything."""


class Settings(BaseSettings):
    """Service settings. Each maps to `HETPLAN_<NAME>` (e.g. `HETPLAN_DATABASE_URL`)."""

    model_config = SettingsConfigDict(env_prefix="HETPLAN_", extra="ignore",
                                      env_ignore_empty=True)
    """An empty variable (`HETPLAN_TOKENS=`) means unset: the default applies."""

    database_url: str = "sqlite:///./hetplan.db"
    """SQLAlchemy URL. `sqlite:///PATH` (embedded default, a file in the working directory)
    or `postgresql+psycopg://USER:PASSWORD@HOST:PORT/DB` (`postgresql://` is accepted too)."""
    tokens: dict[str, list[Scope]] = Field(default_factory=dict)
    """Bearer token -> scopes, as JSON: `{"s3cret": ["upload"], "0ther": ["plan", "admin"]}`.
    Empty: no authentication (only allowed on loopback unless `open` is set)."""
    open: bool = False
    """Allow serving on a non-loopback address without tokens: everyone may do everything."""
    read_requires_token: bool = False
    """When tokens are configured: require a valid token for GET requests too."""
    max_body_bytes: int = Field(default=8 * 2**20, ge=1024)
    """Largest request body accepted; larger bodies get 413."""
    default_time_limit_s: float = Field(default=5.0, gt=0)
    """Solver time limit of a plan request that does not name one."""
    max_time_limit_s: float = Field(default=300.0, gt=0)
    """Cap on any requested solver time limit (requests above it are capped, not refused)."""
    sync_solve_threshold_s: float = Field(default=5.0, ge=0)
    """Plan requests whose time limit is at most this are solved inline (201); longer ones,
    and those whose scenario's untimed steps (templates, baselines) alone would take longer,
    become jobs (202) to poll."""
    solver_workers: int = Field(default_factory=lambda: min(_usable_cores(), 64), ge=1, le=64)
    """Jobs a worker process runs at once (each search in its own search process); the
    default is one per core of the machine."""
    embedded_worker: bool = True
    """`hetplan serve` (each of its processes) also runs a worker that claims jobs. False:
    an API replica only; jobs are run by `hetplan worker` processes (deploy/)."""
    job_lease_s: float = Field(default=30.0, gt=0)
    """How long a worker's claim on a job lasts unless renewed (every third of it): a job
    whose worker died is claimed again after at most this long."""
    job_poll_s: float = Field(default=1.0, gt=0)
    """How often an idle worker looks for queued jobs."""
    max_job_attempts: int = Field(default=3, ge=1)
    """Times a job is started before it fails with `job_attempts_exhausted` (each time
    its worker stopped before finishing it)."""
    solve_in_processes: bool = True
    """Run each search of the built-in planner in a child process: it never stalls the
    server's event loop, a cancelled job stops within a second, and a search still running
    at 1.5 x its time limit + 2 s is killed (`solver_timeout`). False: on server threads."""
    max_search_memory_bytes: int = Field(default=8 * 2**30, ge=2**30)
    """Address space each search process may use (with `solve_in_processes`); a search
    that needs more is stopped and answered 422 `search_memory_exceeded`."""
    search_niceness: int = Field(default=10, ge=0, le=19)
    """How much lower than the server's the CPU priority of search processes is (with
    `solve_in_processes`; `nice` increments, 0: the same): on a busy machine probes and
    reads are answered first, and searches take what CPU is left."""
    max_pending_jobs: int = Field(default=32, ge=1)
    """Queued plus running jobs (of the whole service, in the database) above which new
    jobs get 503."""
    max_inline_solves: int = Field(default=4, ge=1, le=32)
    """Inline plan searches (201 answers) running at once per process; one more is refused
    with 503 and `Retry-After` instead of queueing behind them (jobs queue separately)."""
    max_plan_layers: int = Field(default=1024, ge=1)
    """Most model layers a plan or evaluation may have; beyond it: 422 `scenario_too_large`.
    A search's memory and time grow with layers x layers (the layer partition)."""
    max_plan_gpus: int = Field(default=16_384, ge=1)
    """Most GPUs a plan's cluster may have; beyond it: 422 `scenario_too_large`."""
    plan_cache_bytes: int = Field(default=64 * 2**20, ge=0)
    """Memory for stored plans kept encoded per process (plans are immutable, so caching
    is safe); least recently read plans are dropped first, 0 turns the cache off."""
    catalogue_cache_bytes: int = Field(default=16 * 2**20, ge=0)
    """Memory for the points of profile versions and the links of link versions kept per
    process for assembling plan requests (a stored version never changes, so caching is
    safe; which version is the newest is read every time); 0 turns the cache off."""
    migrate_on_startup: bool = True
    """Run Alembic's upgrade to the newest schema when the app starts."""


def _usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, else the machine's)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


class ExposureRefused(Exception):
    """Serving on a reachable address without tokens was refused."""


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (`localhost`, 127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, settings: Settings) -> None:
    """Refuse to listen on a non-loopback address without tokens unless told to run open."""
    if settings.tokens or settings.open or is_loopback(host):
        return
    raise ExposureRefused(
        f"refusing to serve on {host!r} without tokens: anyone who can reach it could upload "
        "profiles and run solves. Set HETPLAN_TOKENS='{\"TOKEN\": [\"admin\"]}', listen on "
        "127.0.0.1, or set HETPLAN_OPEN=true (or pass --open) to run without authentication."
    )
