"""`hetplan show`: draw a plan (timelines, memory, idle GPUs, baselines, cost) into one
self-contained HTML file, from files or from a hetplan service."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from api.cli.output import fail, load_document

if TYPE_CHECKING:
    from api.viewer import PlanView

__all__ = ["register"]


def show_command(
    plan: Annotated[str, typer.Argument(metavar="PLAN", help="A plan file, or with --server "
                                        "the id of a stored plan.")],
    scenario: Annotated[Path | None, typer.Option(help="The scenario of a plan file.")] = None,
    server: Annotated[str | None, typer.Option(help="Read the stored plan PLAN and its "
                                               "scenario from the hetplan service at this URL."
                                               )] = None,
    token: Annotated[str | None, typer.Option(envvar="HETPLAN_TOKEN",
                                              help="Bearer token for --server.")] = None,
    html_path: Annotated[Path | None, typer.Option("--html", help="Write the page here "
                                                   "(default: PLAN's name with .html).")] = None,
) -> None:
    """Draw a plan into an HTML page that works offline.

    The page shows each distinct pipeline's timeline from the event simulation, memory
    per stage against capacity, idle GPUs and why, the baselines and the cost."""
    from api.viewer import plan_page

    if server is not None:
        view = _stored_view(server, plan, token)
        target = html_path or Path(f"plan-{plan}.html")
    else:
        if scenario is None:
            raise fail("a plan file needs its scenario: add --scenario SCENARIO (or use "
                       "--server URL with a stored plan's id)")
        view = _file_view(Path(plan), scenario)
        target = html_path or Path(plan).with_suffix(".html")
    try:
        target.write_text(plan_page(view, plotly_src=None))
    except OSError as error:
        raise fail(f"cannot write {target}: {error.strerror}") from None
    typer.echo(f"wrote {target}", err=True)


def _file_view(plan_path: Path, scenario_path: Path) -> PlanView:
    from api.viewer import PlanView
    from planner import PlannerError, parse_plan, parse_scenario

    try:
        document = load_document(plan_path)
        plan = parse_plan(document)
        parsed = parse_scenario(load_document(scenario_path))
    except PlannerError as error:
        raise fail(str(error)) from None
    search = document.get("search") or {} if isinstance(document, dict) else {}
    return PlanView(title=plan_path.name, scenario=parsed, plan=plan,
                    status=search.get("status"),
                    baselines_samples_per_s=search.get("baselines_samples_per_s") or {})


def _stored_view(server: str, plan_id: str, token: str | None) -> PlanView:
    from api.client import HetplanClient, HetplanError
    from api.viewer import PlanView
    from planner import parse_plan, parse_scenario

    try:
        with HetplanClient(server, token=token, retries=1) as client:
            answer = client.get_plan(plan_id)
            scenario = client.get_plan_scenario(plan_id)
    except HetplanError as error:
        raise fail(f"{server}: {error}") from None
    search = answer["plan"].get("search") or {}
    return PlanView(title=f"plan {plan_id}", scenario=parse_scenario(scenario),
                    plan=parse_plan(answer["plan"]), status=answer["status"],
                    baselines_samples_per_s=search.get("baselines_samples_per_s") or {},
                    unused_gpus=answer.get("unused_gpus") or {})


def register(app: typer.Typer) -> None:
    app.command("show")(show_command)
