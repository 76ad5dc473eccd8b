"""`hetplan pareto` (the cost/throughput frontier, also as a viewer page) and `hetplan
whatif` (changed fleets).

Heavy imports (the planner, rich) happen inside the commands, so `hetplan --help` stays
fast.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from api.cli.output import fail, load_document, stderr_console

if TYPE_CHECKING:
    from planner.documents import Scenario
    from planner.fleet import FleetOutcome, FleetVariant, WhatIfRow

__all__ = ["register", "parse_added", "parse_removed"]

DEFAULT_JOBS = os.cpu_count() or 1
RayOption = Annotated[str | None, typer.Option(
    "--ray", metavar="ADDRESS",
    help="Plan as Ray tasks: `auto` starts a local Ray, else the cluster's address.")]
JobsOption = Annotated[int, typer.Option(min=1, help="Local processes (or local Ray CPUs).")]
TimeLimitOption = Annotated[float, typer.Option("--time-limit", min=0.1,
                                                help="Search budget per fleet, s.")]


def register(app: typer.Typer) -> None:
    app.command("pareto")(pareto)
    app.command("whatif")(whatif)


def _scenario(path: Path) -> Any:
    import planner

    return planner.parse_scenario(load_document(path))


@contextmanager
def _progress(what: str) -> Iterator[Callable[[float, str], None]]:
    """A rich progress bar on stderr, driven by the planner's (fraction, message) reports."""
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TimeElapsedColumn

    columns = ("{task.description}", BarColumn(), TaskProgressColumn(), TimeElapsedColumn())
    with Progress(*columns, console=stderr_console(), transient=True) as bar:
        task = bar.add_task(what, total=1.0)
        yield lambda fraction, message: bar.update(task, completed=fraction,
                                                   description=message[:60])


def pareto(
    scenario_path: Annotated[Path, typer.Argument(metavar="SCENARIO", help="Scenario JSON/YAML.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the frontier as JSON.")] = False,
    time_limit_s: TimeLimitOption = 2.0,
    max_fleets: Annotated[int, typer.Option(min=1, help="Most sub-fleets planned.")] = 48,
    jobs: JobsOption = DEFAULT_JOBS,
    ray: RayOption = None,
    html_path: Annotated[Path | None, typer.Option(
        "--html", metavar="FILE", help="Also write the frontier as a chart (samples/s "
        "against USD/hour) with every point's plan drawn below it, one offline HTML page; "
        "clicking a point opens its plan.")] = None,
) -> None:
    """The cost/throughput Pareto frontier over subsets of the GPU types and partial fleets."""
    import planner
    from api.sweeps import RayUnavailable, sweep_mapper
    from planner import fleet

    try:
        scenario = _scenario(scenario_path)
        fleet.check_prices(scenario)
        fleets = fleet.sub_fleets(scenario, max_fleets)
        with sweep_mapper(ray, jobs) as mapper, _progress("planning fleets") as report:
            outcomes = fleet.plan_fleets(fleets, planner.SearchOptions(time_limit_s=time_limit_s),
                                         mapper=mapper, progress=report)
    except (planner.PlannerError, RayUnavailable) as error:
        raise fail(str(error)) from None
    points = fleet.frontier(outcomes)
    if html_path is not None:
        _write_frontier_page(html_path, scenario, points)
    if as_json:
        typer.echo(json.dumps({"frontier": [frontier_point(p) for p in points]}, indent=1))
        return
    _print_frontier(points, len(fleets))


def frontier_point(outcome: FleetOutcome) -> dict[str, Any]:
    """One frontier point as the CLI and the API print it."""
    from planner.documents import dump_document
    from planner.estimate import with_estimate

    assert outcome.result is not None, "frontier points are planned"
    return {"samples_per_s": outcome.samples_per_s, "usd_per_hour": outcome.usd_per_hour,
            "usd_per_million_tokens": outcome.result.evaluation.usd_per_million_tokens,
            "fleet": outcome.label,
            "plan": dump_document(with_estimate(outcome.result.plan, outcome.result.evaluation))}


def _write_frontier_page(target: Path, scenario: Scenario, points: list[FleetOutcome]) -> None:
    """The viewer's frontier page, each point's plan drawn in the same file (as the service
    stores it: on the whole fleet, the GPUs left out idle), linked by anchor."""
    from api.viewer import PlanView, chart_point, frontier_page
    from planner import fleet

    views = []
    for n, point in enumerate(points):
        assert point.result is not None, "frontier points are planned"
        whole = fleet.on_whole_scenario(scenario, point, point.result.wall_s,
                                        {"fleet": point.label})
        views.append(PlanView(title=f"point {n}: {point.label}", scenario=scenario,
                              plan=whole.plan, status=whole.status.value,
                              baselines_samples_per_s=dict(whole.baselines),
                              unused_gpus=whole.unused_gpus))
    chart = [chart_point(view, f"#point-{n}") for n, view in enumerate(views)]
    try:
        target.write_text(frontier_page(f"Pareto frontier: {len(points)} points", chart,
                                        plotly_src=None, views=views))
    except OSError as error:
        raise fail(f"cannot write {target}: {error.strerror}") from None
    typer.echo(f"wrote {target}", err=True)


def _print_frontier(points: list[FleetOutcome], num_fleets: int) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Pareto frontier: {len(points)} points from {num_fleets} fleets planned")
    for column in ("samples/s", "USD/hour", "USD/M tokens", "fleet"):
        table.add_column(column)
    for p in points:
        assert p.result is not None
        table.add_row(f"{p.samples_per_s:.2f}", f"{p.usd_per_hour:.2f}",
                      f"{p.result.evaluation.usd_per_million_tokens:.4f}", p.label)
    Console().print(table)


ADDED = re.compile(r"^(?P<type>[^:]+):(?P<nodes>\d+)(x(?P<gpus>\d+))?$")
REMOVED = re.compile(r"^(?P<type>[^:]+):(?P<nodes>\d+)$")


def parse_added(text: str) -> dict[str, Any]:
    """`H100-80G:8x8` (8 nodes of 8 GPUs) or `H100-80G:8` (GPUs as the type's nodes)."""
    found = ADDED.match(text)
    if found is None:
        raise fail(f"--add {text!r}: expected TYPE:NODES or TYPE:NODESxGPUS, "
                                 "e.g. H100-80G:8x8")
    gpus = found["gpus"]
    return {"gpu_type": found["type"], "nodes": int(found["nodes"]),
            "gpus_per_node": None if gpus is None else int(gpus)}


def parse_removed(text: str) -> dict[str, Any]:
    """`V100-32G:2`: two nodes of that type fewer."""
    found = REMOVED.match(text)
    if found is None:
        raise fail(f"--remove {text!r}: expected TYPE:NODES, e.g. V100-32G:2")
    return {"gpu_type": found["type"], "nodes": int(found["nodes"])}


def _variants(add: list[str], remove: list[str], remove_type: list[str],
              inter_node_gb_per_s: float | None, sweep: Path | None) -> list[FleetVariant]:
    """The flags' variant (if any flag is given), then the sweep file's."""
    from planner.fleet import FleetVariant

    variants: list[dict[str, Any]] = []
    if add or remove or remove_type or inter_node_gb_per_s is not None:
        variants.append({
            "add": [parse_added(a) for a in add], "remove": [parse_removed(r) for r in remove],
            "remove_types": list(remove_type),
            "inter_node": None if inter_node_gb_per_s is None
            else {"bandwidth_gb_per_s": inter_node_gb_per_s}})
    if sweep is not None:
        document = load_document(sweep)
        listed = document.get("variants") if isinstance(document, dict) else document
        if not isinstance(listed, list):
            raise fail(f"{sweep}: expected a list of variants or "
                                     "{\"variants\": [...]}")
        variants += listed
    if not variants:
        raise fail("give a change (--add, --remove, --remove-type, "
                                 "--inter-node-gb-per-s) or --sweep FILE")
    from pydantic import ValidationError

    try:
        return [FleetVariant.model_validate(v) for v in variants]
    except ValidationError as error:
        raise fail(f"bad variant: {error}") from None


def whatif(
    scenario_path: Annotated[Path, typer.Argument(metavar="SCENARIO", help="Scenario JSON/YAML.")],
    add: Annotated[list[str], typer.Option(
        help="Nodes to add, TYPE:NODESxGPUS (e.g. H100-80G:8x8); repeatable.")] = [],  # noqa: B006
    remove: Annotated[list[str], typer.Option(
        help="Nodes to remove, TYPE:NODES; repeatable.")] = [],  # noqa: B006
    remove_type: Annotated[list[str], typer.Option(
        help="A GPU type to take out entirely; repeatable.")] = [],  # noqa: B006
    inter_node_gb_per_s: Annotated[float | None, typer.Option(
        min=0.001, help="Change the inter-node bandwidth, GB/s.")] = None,
    sweep: Annotated[Path | None, typer.Option(
        help="JSON/YAML file listing variants (add, remove, remove_types, inter_node, "
        "intra_node, name).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows as JSON.")] = False,
    time_limit_s: TimeLimitOption = 2.0,
    jobs: JobsOption = DEFAULT_JOBS,
    ray: RayOption = None,
) -> None:
    """Plan changed fleets and report throughput, price and their change against the base."""
    import planner
    from api.sweeps import RayUnavailable, sweep_mapper
    from planner import fleet

    variants = _variants(add, remove, remove_type, inter_node_gb_per_s, sweep)
    try:
        scenario = _scenario(scenario_path)
        with sweep_mapper(ray, jobs) as mapper, _progress("planning variants") as report:
            rows = fleet.what_if(scenario, variants,
                                 planner.SearchOptions(time_limit_s=time_limit_s),
                                 mapper=mapper, progress=report)
    except (planner.PlannerError, RayUnavailable) as error:
        raise fail(str(error)) from None
    if as_json:
        typer.echo(json.dumps({"rows": [whatif_row(r) for r in rows]}, indent=1))
        return
    _print_rows(rows)


def whatif_row(row: WhatIfRow) -> dict[str, Any]:
    """One what-if row as `--json` prints it, with its plan."""
    from planner.documents import dump_document

    result = row.outcome.result
    return {**row.numbers(), "plan": None if result is None else dump_document(result.plan)}


def _change(value: float | None) -> str:
    return "" if value is None else f"{value:+.1%}"


def _print_rows(rows: list[WhatIfRow]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="what-if fleets against the base")
    table.add_column("variant", overflow="fold")
    for column in ("GPUs", "samples/s", "change", "USD/hour", "change", "USD/M tokens", "change"):
        table.add_column(column)
    for r in rows:
        if r.samples_per_s is None:
            table.add_row(r.name, str(r.num_gpus), f"no plan: {'; '.join(r.errors)}")
            continue
        table.add_row(r.name, str(r.num_gpus), f"{r.samples_per_s:.2f}",
                      _change(r.samples_per_s_change),
                      "" if r.usd_per_hour is None else f"{r.usd_per_hour:.2f}",
                      _change(r.usd_per_hour_change),
                      "" if r.usd_per_million_tokens is None else f"{r.usd_per_million_tokens:.4f}",
                      _change(r.usd_per_million_tokens_change))
    Console().print(table)
