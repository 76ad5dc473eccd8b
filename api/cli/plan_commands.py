"""`hetplan plan` and `hetplan evaluate`: the planner core from the command line.

A local run and `plan --server` print the same summary: both are turned into one
`PlanSummary` first (from a `PlanResult`, or from the service's plan answer)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from api.cli.output import fail, load_document, nothing_left_to_clean, stderr_console

__all__ = ["register", "load_document", "PlanSummary"]

MAX_IDLE_SHOWN = 8
"""GPU names listed per idle reason; more are counted."""


@dataclass(frozen=True, kw_only=True)
class PlanSummary:
    """What `hetplan plan` reports, wherever the plan was computed."""

    status: str
    wall_s: float
    evaluation: dict[str, Any]
    baselines_samples_per_s: dict[str, float | None]
    unused_gpus: dict[str, str]
    upper_bound_samples_per_s: float | None = None
    """No plan of the scenario runs faster (plan.search; None where none was computed)."""
    plan_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        numbers = ("iteration_s", "samples_per_s", "tokens_per_s", "sync_s", "efficiency",
                   "usd_per_hour", "usd_per_million_tokens")
        summary = {k: v for k, v in asdict(self).items() if k != "evaluation"}
        summary.update({k: self.evaluation.get(k) for k in numbers if k in self.evaluation})
        return summary


def _local_summary(result: Any) -> PlanSummary:
    return PlanSummary(status=result.status.value, wall_s=result.wall_s,
                       evaluation=result.evaluation.to_dict(),
                       baselines_samples_per_s=dict(result.baselines),
                       unused_gpus=dict(result.unused_gpus),
                       upper_bound_samples_per_s=(getattr(result.plan, "search", None)
                                                  or {}).get("upper_bound_samples_per_s"))


def _server_summary(answer: dict[str, Any]) -> PlanSummary:
    search = answer["plan"].get("search") or {}
    return PlanSummary(status=answer["status"], wall_s=answer["wall_s"],
                       evaluation=answer["evaluation"],
                       baselines_samples_per_s=search.get("baselines_samples_per_s") or {},
                       unused_gpus=answer.get("unused_gpus") or {},
                       upper_bound_samples_per_s=search.get("upper_bound_samples_per_s"),
                       plan_id=answer.get("id"))


# Search options that `hetplan plan` and `hetplan batch` both take.
SchedulesOption = Annotated[str | None, typer.Option(
    help="Schedules the plan may use, comma-separated (default: the job's own), e.g. "
         "1f1b,interleaved-1f1b.")]
RecomputeOption = Annotated[bool, typer.Option(
    "--recompute", help="Let stages recompute activations where that helps.")]
ExactOption = Annotated[bool, typer.Option(
    "--exact", help="Enumerate the whole plan space and return the proven optimum (small "
                    "scenarios only: the limit a larger one exceeds is named).")]
MaxLocalBlocksOption = Annotated[int | None, typer.Option(
    min=1, help="For a job whose schedule is local: the most blocks (stages) a pipeline may "
                "have (local learning loses accuracy as blocks multiply).")]


def plan_command(
    scenario_path: Annotated[Path, typer.Argument(metavar="SCENARIO", help="Scenario JSON/YAML.")],
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Write the plan here "
                                                "(default: stdout).")] = None,
    time_limit_s: Annotated[float, typer.Option("--time-limit", min=0.01,
                                                help="Search budget, seconds (of its time-limited "
                                                "steps: templates and baselines are built "
                                                "whatever it is).")] = 10.0,
    server: Annotated[str | None, typer.Option(help="Plan on the hetplan service at this "
                                               "URL instead of locally.")] = None,
    token: Annotated[str | None, typer.Option(envvar="HETPLAN_TOKEN",
                                              help="Bearer token for --server.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON summary on stdout "
                                          "(with the plan in it unless -o is given).")] = False,
    schedules: SchedulesOption = None,
    recompute: RecomputeOption = False,
    exact: ExactOption = False,
    max_local_blocks: MaxLocalBlocksOption = None,
    launcher: Annotated[str | None, typer.Option(
        help="Plan only what this launcher can run: megatron, deepspeed, torchtitan (one grid "
             "of identical pipelines), or another export format.")] = None,
    objective: Annotated[str, typer.Option(
        help="throughput (most samples/s) or cost (least USD per million tokens); with cost, "
        "a budget or a floor, sub-fleets are planned, --time-limit each.")] = "throughput",
    max_usd_per_hour: Annotated[float | None, typer.Option(
        min=0, help="Budget: USD/hour of the GPUs the plan uses.")] = None,
    min_samples_per_s: Annotated[float | None, typer.Option(
        min=0, help="Floor: samples/s the plan must reach.")] = None,
) -> None:
    """Find the best plan for a scenario and print a summary.

    The summary (pipelines, throughput, baselines, idle GPUs and why) goes to stderr and
    the plan to stdout or -o; with --json, a JSON summary goes to stdout instead."""
    nothing_left_to_clean()  # the search reaps its child and threads before it returns
    if output is not None and not output.resolve().parent.is_dir():
        raise fail(f"cannot write {output}: its folder does not exist")  # before a long search
    document = load_document(scenario_path)
    choice = schedule_choice(schedules, recompute, exact, max_local_blocks, launcher)
    goal = _goal(objective, max_usd_per_hour, min_samples_per_s)
    if server is None:
        plan_document, summary = _plan_locally(document, time_limit_s, choice, goal,
                                               show_progress=not as_json)
    else:
        plan_document, summary = _plan_on_server(document, time_limit_s, choice, goal, server,
                                                 token)
    if as_json:
        answer = summary.to_json()
        if output is None:
            answer["plan"] = plan_document
        else:
            _write_plan(plan_document, output)
            answer["output"] = str(output)
        typer.echo(json.dumps(answer, indent=1))
        return
    _print_summary(summary)
    _write_plan(plan_document, output)


@dataclass(frozen=True, kw_only=True)
class ScheduleChoice:
    """`--schedules` (names, checked), `--recompute`, `--exact`, `--max-local-blocks` and
    `--launcher`."""

    schedules: tuple[str, ...]
    recompute: bool
    exact: bool = False
    max_local_blocks: int | None = None
    launcher: str | None = None

    def search_fields(self) -> dict[str, Any]:
        """These choices as fields of `SearchOptions` (planner imported only when asked)."""
        from planner.documents import Schedule

        return {"schedules": tuple(Schedule(n) for n in self.schedules),
                "recompute": self.recompute, "exact": self.exact,
                "max_local_blocks": self.max_local_blocks, "launcher": self.launcher}

    def as_request(self) -> dict[str, Any]:
        chosen: dict[str, Any] = {"recompute": self.recompute} if self.recompute else {}
        if self.exact:
            chosen["exact"] = True
        if self.schedules:
            chosen["schedules"] = list(self.schedules)
        if self.max_local_blocks is not None:
            chosen["max_local_blocks"] = self.max_local_blocks
        if self.launcher:
            chosen["launcher"] = self.launcher
        return chosen


def schedule_choice(schedules: str | None, recompute: bool, exact: bool,
                    max_local_blocks: int | None, launcher: str | None = None
                    ) -> ScheduleChoice:
    """The search options given on the command line, checked."""
    return ScheduleChoice(schedules=_schedule_names(schedules), recompute=recompute,
                          exact=exact, max_local_blocks=max_local_blocks,
                          launcher=_launcher_name(launcher))


def _launcher_name(name: str | None) -> str | None:
    """`--launcher` checked against the export formats, or a clear exit naming them."""
    if name is None:
        return None
    from planner.export import FORMATS  # only when a launcher is named: it costs an import

    if name not in FORMATS:
        raise typer.BadParameter(f"unknown launcher {name!r}; choose among {sorted(FORMATS)}",
                                 param_hint="--launcher")
    return name


def _schedule_names(listed: str | None) -> tuple[str, ...]:
    """`--schedules` as schedule names, or a clear exit naming the ones known."""
    from planner.documents import Schedule

    names = tuple(name.strip() for name in (listed or "").split(",") if name.strip())
    known = [s.value for s in Schedule]
    unknown = [name for name in names if name not in known]
    if unknown:
        raise typer.BadParameter(f"unknown schedule(s) {list(unknown)}; choose among {known}",
                                 param_hint="--schedules")
    return names


def _goal(objective: str, max_usd_per_hour: float | None,
          min_samples_per_s: float | None) -> dict[str, Any]:
    """The goal in money as `options` of a plan request (and of `ObjectiveOptions`)."""
    if objective not in ("throughput", "cost"):
        raise fail(f"--objective {objective!r}: expected one of throughput, cost")
    goal = {"objective": objective, "max_usd_per_hour": max_usd_per_hour,
            "min_samples_per_s": min_samples_per_s}
    return {key: value for key, value in goal.items() if value is not None}


def _plan_locally(document: Any, time_limit_s: float, choice: ScheduleChoice,
                  goal: dict[str, Any], *, show_progress: bool
                  ) -> tuple[dict[str, Any], PlanSummary]:
    from rich.progress import Progress

    from planner import PlannerError, parse_scenario
    from planner.documents import dump_document
    from planner.fleet import Objective, ObjectiveOptions, plan_with_objective

    try:
        scenario = parse_scenario(document)
        # Redrawn on each update, not by rich's refresh thread: a search runs part of its
        # work in a forked child only when no other thread runs (planner/search/aside.py).
        with Progress(console=stderr_console(), transient=True, auto_refresh=False,
                      disable=not show_progress) as bar:
            task = bar.add_task("planning", total=1.0)
            options = ObjectiveOptions(
                time_limit_s=time_limit_s, **choice.search_fields(),
                **{**goal, "objective": Objective(goal["objective"])})
            result = plan_with_objective(
                scenario, options,
                progress=lambda f, msg: bar.update(task, completed=f, description=msg,
                                                   refresh=True))
    except PlannerError as error:
        raise fail(str(error)) from None
    return dump_document(result.plan), _local_summary(result)


def _plan_on_server(document: Any, time_limit_s: float, choice: ScheduleChoice,
                    goal: dict[str, Any], server: str,
                    token: str | None) -> tuple[dict[str, Any], PlanSummary]:
    from api.client import HetplanClient, HetplanError

    try:
        with HetplanClient(server, token=token, retries=1) as client:
            answer = client.request_plan({"scenario": document,
                                          "options": {**choice.as_request(), **goal}},
                                         time_limit_s=time_limit_s)
    except HetplanError as error:
        raise fail(f"{server}: {error}") from None
    return answer["plan"], _server_summary(answer)


def evaluate_command(
    scenario_path: Annotated[Path, typer.Argument(metavar="SCENARIO", help="Scenario JSON/YAML.")],
    plan_path: Annotated[Path, typer.Argument(metavar="PLAN", help="Plan JSON/YAML.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the numbers as JSON.")] = False,
) -> None:
    """Check a plan against a scenario and estimate it.

    Every broken rule is listed; the exit code is 1 when the plan is invalid."""
    nothing_left_to_clean()
    from planner import PlannerError, evaluate, parse_plan, parse_scenario

    try:
        scenario = parse_scenario(load_document(scenario_path))
        evaluation = evaluate(scenario, parse_plan(load_document(plan_path)))
    except PlannerError as error:
        raise fail(str(error)) from None
    numbers = evaluation.to_dict()
    if as_json:
        typer.echo(json.dumps(numbers, indent=1))
    else:
        _print_evaluation(numbers)
    if not evaluation.valid:
        raise typer.Exit(code=1)


def _write_plan(document: dict[str, Any], output: Path | None) -> None:
    text = json.dumps(document, indent=1)
    if output is None:
        typer.echo(text)
        return
    try:
        output.write_text(text + "\n")
    except OSError as error:
        raise fail(f"cannot write {output}: {error.strerror}") from None
    stderr_console().print(f"plan written to {output}", soft_wrap=True, highlight=False)


def _print_evaluation(evaluation: dict[str, Any]) -> None:
    from rich.table import Table

    console = stderr_console()
    if not evaluation["valid"]:
        console.print(f"[red]invalid plan[/red] ({len(evaluation['errors'])} problem(s)):")
        for error in evaluation["errors"]:
            console.print(f"  - {error}", markup=False)
    if evaluation.get("iteration_s") is None:
        return
    table = Table(title="pipelines")
    for column in ("#", "b x m", r"stages (type tp \[layers])", "T_p s", "max mem GiB / cap"):
        table.add_column(column)
    for indices, cells in _pipeline_rows(evaluation["pipelines"]):
        shown = str(indices[0]) if len(indices) == 1 else f"{indices[0]}-{indices[-1]}"
        table.add_row(shown, *cells)
    console.print(table)
    efficiency = evaluation.get("efficiency")
    shown = "" if efficiency is None else f", efficiency {efficiency:.1%}"
    console.print(f"iteration {evaluation['iteration_s']:.4f} s (sync {evaluation['sync_s']:.4f} s),"
                  f" {evaluation['samples_per_s']:.2f} samples/s, "
                  f"{evaluation['tokens_per_s']:.0f} tokens/s{shown}")
    console.print(_price_summary(evaluation))
    for warning in evaluation.get("warnings") or []:
        console.print(f"[yellow]warning:[/yellow] {warning}")


def _pipeline_rows(pipelines: list[dict[str, Any]]) -> list[tuple[list[int], tuple[str, ...]]]:
    """One row per run of consecutive pipelines of the same shape (a 512-GPU plan's
    replicas), with their indices; replicas placed apart differ a little in time (their
    transfers cross nodes at other stages), shown as the range."""
    runs: list[tuple[list[int], tuple[str, ...], list[float]]] = []
    for p in pipelines:
        worst = max(p["stages"], key=lambda s: s["memory_gib"] / s["capacity_gib"])
        cells = (f"{p['micro_batch_size']} x {p['num_micro_batches']}",
                 ", ".join(_stage_summary(s) for s in p["stages"]),
                 f"{worst['memory_gib']:.1f} / {worst['capacity_gib']:g}")
        if runs and runs[-1][1] == cells and runs[-1][0][-1] == p["index"] - 1:
            runs[-1][0].append(p["index"])
            runs[-1][2].append(p["T_p"])
        else:
            runs.append(([p["index"]], cells, [p["T_p"]]))
    rows: list[tuple[list[int], tuple[str, ...]]] = []
    for indices, (size, stages, memory), times in runs:
        low, high = f"{min(times):.3f}", f"{max(times):.3f}"
        rows.append((indices, (size, stages, low if low == high else f"{low}-{high}", memory)))
    return rows


def _stage_summary(stage: dict[str, Any]) -> str:
    """`A100-80G tp2 [0,12)`; chunks as `[0,6)+[12,18)`; `R` when the stage recomputes."""
    ranges = stage.get("chunks") or [stage["layers"] or []]
    shown = "+".join(f"[{start},{end})" for start, end in ranges)
    return f"{stage['gpu_type']} tp{stage['tp']} {shown}{' R' if stage.get('recompute') else ''}"


def _price_summary(evaluation: dict[str, Any]) -> str:
    if evaluation.get("usd_per_hour") is None:
        return "price: unknown (a GPU type the plan uses has no hourly_usd)"
    return (f"price: ${evaluation['usd_per_hour']:.2f}/hour for the GPUs used, "
            f"${evaluation['usd_per_million_tokens']:.4f} per million tokens, "
            f"${evaluation['usd_per_iteration']:.4f} per iteration")


def _print_summary(summary: PlanSummary) -> None:
    console = stderr_console()
    _print_evaluation(summary.evaluation)
    rate = summary.evaluation.get("samples_per_s") or 0.0
    for name, baseline in summary.baselines_samples_per_s.items():
        gain = f"{rate / baseline:.2f}x" if baseline else "no valid plan"
        shown = f"{baseline:.2f} samples/s" if baseline else "-"
        console.print(f"baseline {name}: {shown}; hetplan gains {gain}")
    bound = summary.upper_bound_samples_per_s
    if bound:
        console.print(f"upper bound: {bound:.2f} samples/s; no plan runs faster, this one is "
                      f"at {rate / bound:.0%} of it")
    for line in idle_lines(summary.unused_gpus):
        console.print(line, markup=False, highlight=False)
    console.print(f"status {summary.status}, {len(summary.unused_gpus)} GPU(s) left idle, "
                  f"searched in {summary.wall_s:.2f} s")
    if summary.plan_id:
        console.print(f"stored on the server as plan {summary.plan_id}", soft_wrap=True)


def idle_lines(unused_gpus: dict[str, str]) -> list[str]:
    """One line per reason a GPU is idle, naming the GPUs (the first few, then a count)."""
    by_reason: dict[str, list[str]] = {}
    for gpu, reason in unused_gpus.items():
        by_reason.setdefault(reason, []).append(gpu)
    lines = []
    for reason, gpus in by_reason.items():
        named = ", ".join(gpus[:MAX_IDLE_SHOWN])
        more = f" and {len(gpus) - MAX_IDLE_SHOWN} more" if len(gpus) > MAX_IDLE_SHOWN else ""
        lines.append(f"idle {named}{more}: {reason}")
    return lines


def register(app: typer.Typer) -> None:
    app.command("plan")(plan_command)
    app.command("evaluate")(evaluate_command)
