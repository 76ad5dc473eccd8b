"""`hetplan plan` and `hetplan evaluate`: the planner core from the command line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from planner import (
    Evaluation,
    PlannerError,
    PlanResult,
    evaluate,
    parse_plan,
    parse_scenario,
)
from planner.documents import dump_document
from planner.estimate import ChunkedStageEstimate, StageEstimate, with_estimate
from planner.fleet import Objective, ObjectiveOptions, plan_with_objective

__all__ = ["register", "load_document"]

console = Console(stderr=True)


def load_document(path: Path) -> Any:
    """A JSON or YAML document from disk, or a clear exit."""
    try:
        text = path.read_text()
    except OSError as error:
        raise typer.BadParameter(f"cannot read {path}: {error.strerror}") from None
    try:
        if path.suffix.lower() in {".yaml", ".yml"}:
            return yaml.safe_load(text)
        return json.loads(text)
    except (json.JSONDecodeError, yaml.YAMLError) as error:
        raise typer.BadParameter(f"{path} is not valid JSON/YAML: {error}") from None


def _fail(error: Exception) -> typer.Exit:
    console.print(f"[red]error:[/red] {error}")
    return typer.Exit(code=2)


def plan_command(
    scenario_path: Annotated[Path, typer.Argument(metavar="SCENARIO", help="Scenario JSON/YAML.")],
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Write the plan here.")] = None,
    time_limit_s: Annotated[float, typer.Option("--time-limit", help="Search budget, s.")] = 10.0,
    server: Annotated[str | None, typer.Option(help="Plan on a hetplan server at this URL.")] = None,
    token: Annotated[str | None, typer.Option(envvar="HETPLAN_TOKEN", help="Bearer token.")] = None,
    objective: Annotated[str, typer.Option(
        help="throughput (most samples/s) or cost (least USD per million tokens).")] = "throughput",
    max_usd_per_hour: Annotated[float | None, typer.Option(
        min=0, help="Budget: USD/hour of the GPUs the plan uses.")] = None,
    min_samples_per_s: Annotated[float | None, typer.Option(
        min=0, help="Floor: samples/s the plan must reach.")] = None,
) -> None:
    """Find the best plan for a scenario and print a summary."""
    document = load_document(scenario_path)
    if server is not None:
        from api.client import HetplanClient

        goal = {"objective": objective, "max_usd_per_hour": max_usd_per_hour,
                "min_samples_per_s": min_samples_per_s}
        body = HetplanClient(server, token=token).request_plan(
            {"scenario": document, "options": {k: v for k, v in goal.items() if v is not None}},
            time_limit_s=time_limit_s)
        plan_doc = body.get("plan", body)
        _write(plan_doc, output)
        console.print_json(json.dumps(body.get("estimate") or plan_doc.get("estimate")))
        return
    try:
        scenario = parse_scenario(document)
        with Progress(console=console, transient=True) as bar:
            task = bar.add_task("planning", total=1.0)
            result = plan_with_objective(
                scenario, _objective_options(objective, time_limit_s, max_usd_per_hour,
                                             min_samples_per_s),
                progress=lambda f, msg: bar.update(task, completed=f, description=msg))
    except PlannerError as error:
        raise _fail(error) from None
    _print_result(result)
    _write(dump_document(with_estimate(result.plan, result.evaluation)), output)


def _objective_options(objective: str, time_limit_s: float, max_usd_per_hour: float | None,
                       min_samples_per_s: float | None) -> ObjectiveOptions:
    try:
        chosen = Objective(objective)
    except ValueError:
        raise typer.BadParameter(f"--objective {objective!r}: expected one of "
                                 f"{', '.join(o.value for o in Objective)}") from None
    return ObjectiveOptions(time_limit_s=time_limit_s, objective=chosen,
                            max_usd_per_hour=max_usd_per_hour,
                            min_samples_per_s=min_samples_per_s)


def evaluate_command(
    scenario_path: Annotated[Path, typer.Argument(metavar="SCENARIO")],
    plan_path: Annotated[Path, typer.Argument(metavar="PLAN")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the numbers as JSON.")] = False,
) -> None:
    """Validate any plan against a scenario and estimate it with the reference model."""
    try:
        scenario = parse_scenario(load_document(scenario_path))
        evaluation = evaluate(scenario, parse_plan(load_document(plan_path)))
    except PlannerError as error:
        raise _fail(error) from None
    if as_json:
        typer.echo(json.dumps(evaluation.to_dict(), indent=1))
    else:
        _print_evaluation(evaluation)
    if not evaluation.valid:
        raise typer.Exit(code=1)


def _write(document: dict[str, Any], output: Path | None) -> None:
    text = json.dumps(document, indent=1)
    if output is None:
        typer.echo(text)
    else:
        output.write_text(text + "\n")
        console.print(f"plan written to {output}")


def _print_evaluation(evaluation: Evaluation) -> None:
    if not evaluation.valid:
        console.print(f"[red]invalid plan[/red] ({len(evaluation.errors)} problem(s)):")
        for error in evaluation.errors:
            console.print(f"  - {error}")
    if evaluation.iteration_s is None:
        return
    table = Table(title=f"pipelines ({evaluation.schedule})")
    columns = ("#", "b x m", "stages (type tp \\[layers], R: recompute)", "T_p s",
               "max mem GiB / cap")
    for column in columns:
        table.add_column(column)
    for p in evaluation.pipelines:
        stages = ", ".join(_stage_summary(s) for s in p.stages)
        worst = max(p.stages, key=lambda s: s.memory_gib / s.capacity_gib)
        table.add_row(str(p.index), f"{p.micro_batch_size} x {p.num_micro_batches}", stages,
                      f"{p.T_p:.3f}", f"{worst.memory_gib:.1f} / {worst.capacity_gib:g}")
    console.print(table)
    efficiency = "" if evaluation.efficiency is None else f", efficiency {evaluation.efficiency:.1%}"
    console.print(f"iteration {evaluation.iteration_s:.4f} s (sync {evaluation.sync_s:.4f} s), "
                  f"{evaluation.samples_per_s:.2f} samples/s, {evaluation.tokens_per_s:.0f} tokens/s"
                  f"{efficiency}")
    console.print(_price_summary(evaluation))
    for warning in evaluation.warnings:
        console.print(f"[yellow]warning:[/yellow] {warning}")


def _stage_summary(stage: StageEstimate) -> str:
    """`A100-80G tp2 [0,12)`; chunks as `[0,6)+[12,18)`; `R` when the stage recomputes."""
    ranges = stage.chunks if isinstance(stage, ChunkedStageEstimate) else [stage.layers or []]
    shown = "+".join(f"[{start},{end})" for start, end in ranges)
    return f"{stage.gpu_type} tp{stage.tp} {shown}{' R' if stage.recompute else ''}"


def _price_summary(evaluation: Evaluation) -> str:
    if evaluation.usd_per_hour is None:
        return "price: unknown (a GPU type the plan uses has no hourly_usd)"
    return (f"price: ${evaluation.usd_per_hour:.2f}/hour for the GPUs used, "
            f"${evaluation.usd_per_million_tokens:.4f} per million tokens, "
            f"${evaluation.usd_per_iteration:.4f} per iteration")


def _print_result(result: PlanResult) -> None:
    _print_evaluation(result.evaluation)
    rate = result.evaluation.samples_per_s or 0.0
    for name, baseline in result.baselines.items():
        gain = f"{rate / baseline:.2f}x" if baseline else "no valid plan"
        shown = f"{baseline:.2f} samples/s" if baseline else "-"
        console.print(f"baseline {name}: {shown}; hetplan gains {gain}")
    console.print(f"status {result.status.value}, {len(result.unused_gpus)} GPU(s) left idle, "
                  f"searched in {result.wall_s:.2f} s")


def register(app: typer.Typer) -> None:
    app.command("plan")(plan_command)
    app.command("evaluate")(evaluate_command)
