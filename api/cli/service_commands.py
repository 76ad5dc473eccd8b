"""`hetplan serve` (the HTTP service), `hetplan worker` (runs its jobs) and `hetplan batch`
(plan a folder of scenarios, for CI)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from api.cli.output import fail, stderr_console
from api.cli.plan_commands import (
    ExactOption,
    MaxLocalBlocksOption,
    RecomputeOption,
    ScheduleChoice,
    SchedulesOption,
    schedule_choice,
)

__all__ = ["register", "BatchOutcome", "plan_file", "plan_file_task", "worker"]

SCENARIO_SUFFIXES = (".json", ".yaml", ".yml")


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
    app.command("worker")(worker)
    app.command("batch")(batch)


def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    workers: Annotated[int, typer.Option(min=1, help="Server processes.")] = 1,
    open_: Annotated[bool, typer.Option("--open", help="Serve without tokens on a "
                                        "non-loopback address (anyone may write).")] = False,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
) -> None:
    """Serve the hetplan HTTP API (docs at /docs).

    Each server process also runs a worker for plan jobs unless HETPLAN_EMBEDDED_WORKER
    is false (then run `hetplan worker`). Settings come from HETPLAN_* variables
    (docs/service.md)."""
    import uvicorn

    from api.app import create_app
    from api.serving import PROTOCOL_PATH
    from api.settings import ExposureRefused, Settings, check_exposure
    from api.storage import make_engine, migrate

    if open_:
        os.environ["HETPLAN_OPEN"] = "true"  # worker processes read settings from env
    settings = Settings()
    try:
        check_exposure(host, settings)
    except ExposureRefused as error:
        raise fail(str(error)) from None
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError

    try:
        engine = make_engine(settings.database_url)
        try:
            migrate(engine)  # once, before any worker starts
        finally:
            engine.dispose()
    except (ArgumentError, SQLAlchemyError) as error:
        reason = " ".join(str(error).split())[:300]
        raise fail(f"cannot use the database {settings.database_url!r} (HETPLAN_DATABASE_URL): "
                   f"{reason}") from None
    if workers == 1:
        app = create_app(settings.model_copy(update={"migrate_on_startup": False}))
        uvicorn.run(app, host=host, port=port, log_level=log_level, http=PROTOCOL_PATH)
    else:
        uvicorn.run("api.app:create_app_from_env", factory=True, host=host, port=port,
                    workers=workers, log_level=log_level, http=PROTOCOL_PATH)


def worker(
    concurrency: Annotated[int | None, typer.Option(
        min=1, max=64, help="Jobs run at once (default HETPLAN_SOLVER_WORKERS: one per "
        "core).")] = None,
) -> None:
    """Run queued plan jobs from the service's database until stopped (SIGTERM, Ctrl-C).

    Any number of workers, on any machine that reaches the database, share the jobs;
    a job whose worker dies is taken over by another. Settings come from HETPLAN_*
    variables (HETPLAN_DATABASE_URL first of all; docs/service.md)."""
    import signal
    import threading

    from sqlalchemy.exc import ArgumentError, SQLAlchemyError

    from api.jobs import Worker
    from api.metrics import Metrics
    from api.settings import Settings
    from api.solving import ProcessSolver, start_search_server
    from api.storage import Store, make_engine, migrate

    settings = Settings()
    try:
        engine = make_engine(settings.database_url)
        if settings.migrate_on_startup:
            migrate(engine)
    except (ArgumentError, SQLAlchemyError) as error:
        reason = " ".join(str(error).split())[:300]
        raise fail(f"cannot use the database {settings.database_url!r} (HETPLAN_DATABASE_URL): "
                   f"{reason}") from None
    concurrency = concurrency or settings.solver_workers
    solver = ProcessSolver(max_memory_bytes=settings.max_search_memory_bytes,
                           max_idle=concurrency,  # a warm search process per slot
                           niceness=settings.search_niceness)
    start_search_server()
    store = Store(engine, cache_bytes=settings.catalogue_cache_bytes)
    jobs = Worker(store=store, solver=solver, metrics=Metrics(), concurrency=concurrency,
                  lease_s=settings.job_lease_s, poll_s=settings.job_poll_s,
                  max_attempts=settings.max_job_attempts)
    stopped = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopped.set())
    jobs.start()
    stderr_console().print(f"hetplan worker {jobs.name}: running up to {jobs.concurrency} "
                           "jobs at once; stop with Ctrl-C")
    try:
        while not stopped.wait(1.0):
            pass
    finally:
        jobs.stop()
        solver.close()
        engine.dispose()


@dataclass(frozen=True, kw_only=True)
class BatchOutcome:
    """What happened to one scenario file of a batch."""

    scenario: str
    ok: bool
    status: str | None = None
    iteration_s: float | None = None
    samples_per_s: float | None = None
    wall_s: float | None = None
    plan_path: str | None = None
    error: str | None = None


def plan_file(path: Path, out_dir: Path, time_limit_s: float,
              choice: ScheduleChoice) -> BatchOutcome:
    """Plan one scenario file and write `<stem>.plan.json`; never raises for bad input."""
    import planner
    from planner.documents import dump_document

    try:
        scenario = planner.parse_scenario(_load(path))
        result = planner.plan(scenario, planner.SearchOptions(time_limit_s=time_limit_s,
                                                              **choice.search_fields()))
    except (planner.PlannerError, OSError, ValueError) as error:
        return BatchOutcome(scenario=path.name, ok=False,
                            error=f"{type(error).__name__}: {error}")
    target = out_dir / f"{_stem(path)}.plan.json"
    target.write_text(json.dumps(dump_document(result.plan), indent=2) + "\n")
    return BatchOutcome(scenario=path.name, ok=True, status=str(result.status),
                        iteration_s=result.evaluation.iteration_s,
                        samples_per_s=result.evaluation.samples_per_s,
                        wall_s=result.wall_s, plan_path=str(target))


def plan_file_task(task: tuple[Path, Path, float, ScheduleChoice]) -> BatchOutcome:
    """`plan_file` on one (scenario path, output folder, time limit, search options): a
    sweep's task."""
    return plan_file(*task)


def _stem(path: Path) -> str:
    return path.name[: -len(path.suffix)] if path.suffix else path.name


def _load(path: Path) -> Any:
    text = path.read_text()
    if path.suffix == ".json":
        return json.loads(text)
    import yaml

    return yaml.safe_load(text)


def batch(
    scenario_dir: Annotated[Path, typer.Argument(exists=True, file_okay=False,
                                                 metavar="SCENARIO_DIR",
                                                 help="Folder of scenario documents.")],
    out: Annotated[Path, typer.Option("--out", help="Folder for the plan documents.")],
    jobs: Annotated[int, typer.Option(min=1, help="Parallel processes.")] = (
        os.cpu_count() or 1),
    time_limit_s: Annotated[float, typer.Option("--time-limit", min=0.1,
                                                help="Search budget per scenario, seconds."
                                                )] = 10.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON on "
                                          "stdout instead of a table.")] = False,
    ray: Annotated[str | None, typer.Option(
        "--ray", metavar="ADDRESS", help="Plan as Ray tasks: `auto` starts a local Ray, "
        "else the cluster's address (workers must see --out).")] = None,
    schedules: SchedulesOption = None,
    recompute: RecomputeOption = False,
    exact: ExactOption = False,
    max_local_blocks: MaxLocalBlocksOption = None,
) -> None:
    """Plan every scenario of a folder, in parallel.

    The exit code is 1 if any scenario failed.

    Each plan goes to OUT/<name>.plan.json and the summary to OUT/batch-summary.json."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    choice = schedule_choice(schedules, recompute, exact, max_local_blocks)
    paths = sorted(p for p in scenario_dir.iterdir() if p.suffix in SCENARIO_SUFFIXES)
    if not paths:
        raise fail(f"no scenario files ({', '.join(SCENARIO_SUFFIXES)}) in {scenario_dir}")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise fail(f"cannot create the output folder {out}: {error.strerror}") from None
    console = stderr_console()
    outcomes: list[BatchOutcome] = []
    columns = ("{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    from api.sweeps import RayUnavailable, sweep_mapper

    try:
        with Progress(*columns, console=console) as progress, sweep_mapper(
                ray, min(jobs, len(paths))) as mapper:
            task = progress.add_task("planning", total=len(paths))
            for outcome in mapper(plan_file_task, [(p, out, time_limit_s, choice) for p in paths]):
                outcomes.append(outcome)
                progress.advance(task)
    except RayUnavailable as error:
        raise fail(str(error)) from None
    outcomes.sort(key=lambda o: o.scenario)
    summary = [asdict(o) for o in outcomes]
    (out / "batch-summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    failed = sum(not o.ok for o in outcomes)
    if as_json:
        typer.echo(json.dumps(summary, indent=1))
    else:
        _print_table(outcomes, title=f"hetplan batch: {scenario_dir}")
    if failed:
        console.print(f"{failed} of {len(outcomes)} scenarios failed")
        raise typer.Exit(1)


def _print_table(outcomes: list[BatchOutcome], *, title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in ("scenario", "result", "status", "iteration_s", "samples/s", "wall_s"):
        table.add_column(column)
    for o in outcomes:
        table.add_row(o.scenario, "ok" if o.ok else f"FAILED: {o.error}", o.status or "",
                      _fmt(o.iteration_s), _fmt(o.samples_per_s), _fmt(o.wall_s))
    Console().print(table)


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{value:.4g}"
