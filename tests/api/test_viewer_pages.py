"""The viewer's pages as HTML, without a browser (tests/browser clicks through them): the
frontier page links every point to its plan, refuses bad id lists, and `hetplan pareto
--html` writes the chart with each point's plan in the same file; plans of every
schedule get a timeline."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from api.cli import app
from api.routes.ui import MAX_CHART_PLANS
from api.viewer import PlanView, plan_page
from planner import parse_plan, parse_scenario
from tests.planner.fleet_scenarios import priced
from tests.planner.scenarios import deep, pipeline, plan, stage
from tests.planner.test_estimate_schedules import interleaved_two_by_two

LINK = re.compile(r"<td><a href='([^']*)'>")


@pytest.fixture
def frontier_ids(client: TestClient) -> list[str]:
    response = client.post("/v1/plans/pareto", json={"scenario": priced(),
                                                     "options": {"time_limit_s": 1}})
    assert response.status_code == 201, response.text
    return [p["plan_id"] for p in response.json()["frontier"]]


def test_frontier_page_links_each_stored_plan(client: TestClient,
                                              frontier_ids: list[str]) -> None:
    response = client.get("/ui/frontier", params={"plans": ",".join(frontier_ids)})
    assert response.status_code == 200, response.text
    assert LINK.findall(response.text) == [f"plans/{i}" for i in frontier_ids]
    assert "<div id=\"frontier\"" in response.text
    for plan_id in frontier_ids:  # each link opens a page
        assert client.get(f"/ui/plans/{plan_id}").status_code == 200


def test_frontier_page_of_an_unknown_plan_is_404(client: TestClient,
                                                 frontier_ids: list[str]) -> None:
    response = client.get("/ui/frontier", params={"plans": f"{frontier_ids[0]},0123abcd"})
    assert response.status_code == 404
    assert "0123abcd" in response.json()["message"]


@pytest.mark.parametrize("plans", [",", ",".join(f"{n:08x}" for n in range(MAX_CHART_PLANS + 1))],
                         ids=["no id", "too many ids"])
def test_frontier_page_with_no_or_too_many_ids_is_422(client: TestClient, plans: str) -> None:
    response = client.get("/ui/frontier", params={"plans": plans})
    assert response.status_code == 422
    assert f"give 1 to {MAX_CHART_PLANS}" in response.json()["message"]


def test_hetplan_pareto_html_holds_every_points_plan(tmp_path: Path) -> None:
    scenario = tmp_path / "priced.json"
    scenario.write_text(json.dumps(priced()))
    target = tmp_path / "frontier.html"
    result = CliRunner().invoke(app, ["pareto", str(scenario), "--jobs", "1", "--time-limit",
                                      "1", "--html", str(target)])
    assert result.exit_code == 0, result.output
    page = target.read_text()
    assert LINK.findall(page) == ["#point-0", "#point-1", "#point-2"]
    for n in range(3):
        assert f"<div id='point-{n}'>" in page and f"id=\"point-{n}-timeline-0\"" in page
    assert "<script src=" not in page  # plotly.js inlined: the file works on its own


@pytest.mark.parametrize(("scenario", "plan_doc", "drawn"), [
    (deep(4), interleaved_two_by_two(recompute=True), "recompute"),
    (deep(3, schedule="local", local_head_kind="h"),
     plan(pipeline([stage(["n0:0"], (0, 1)), stage(["n1:0"], (1, 3))]), schedule="local"),
     "head"),
], ids=["interleaved-1f1b with recompute", "local"])
def test_a_version_1_1_schedule_gets_a_timeline(scenario: dict[str, object],
                                                plan_doc: dict[str, object], drawn: str) -> None:
    view = PlanView(title="p", scenario=parse_scenario(scenario), plan=parse_plan(plan_doc))
    page = plan_page(view, plotly_src="plotly.js")
    assert "id=\"plan-timeline-0\"" in page and "no timeline drawn" not in page
    assert f"\"name\":\"{drawn}\"" in page
    # A plan file records no reasons, yet the six GPUs of the cluster it leaves are listed.
    assert "idle GPUs (6)" in page and "n0:3</td><td>not in the plan" in page
