"""The frontier chart in a real browser with the network cut: it renders, and clicking a
point opens that point's plan (the service's plan page, or its section of the offline
page `hetplan pareto --html` writes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from typer.testing import CliRunner

from api.cli import app
from tests.browser.conftest import LiveServer, OfflinePage
from tests.planner.fleet_scenarios import priced

TIMEOUT_MS = 30_000


def click_point(offline: OfflinePage, n: int) -> None:
    """Click the n-th point (cheapest first) of the chart's frontier line where it is
    drawn on screen, as a person would."""
    page = offline.page
    page.wait_for_selector("#frontier .main-svg", timeout=TIMEOUT_MS)
    points = page.locator("#frontier .scatterlayer .trace").first.locator("path.point")
    box = points.nth(n).bounding_box()
    assert box is not None, f"point {n} is not drawn"
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)


def test_clicking_a_frontier_point_opens_its_stored_plan(live_server: LiveServer,
                                                         offline_page: OfflinePage) -> None:
    answer = httpx.post(f"{live_server.url}/v1/plans/pareto", timeout=120,
                        json={"scenario": priced(), "options": {"time_limit_s": 1}})
    assert answer.status_code == 201, answer.text
    frontier: list[dict[str, Any]] = answer.json()["frontier"]  # cheapest first
    ids = [p["plan_id"] for p in frontier]
    page = offline_page.page
    page.goto(f"{live_server.url}/ui/frontier?plans={','.join(ids)}")
    drawn = page.evaluate("() => document.getElementById('frontier').data"
                          ".map(t => Array.from(t.x).length)")
    assert drawn == [len(frontier)]  # one frontier line, no dominated point
    click_point(offline_page, 1)
    page.wait_for_url(f"{live_server.url}/ui/plans/{ids[1]}", timeout=TIMEOUT_MS)
    assert page.inner_text("h1") == f"plan {ids[1]}"
    page.wait_for_selector("#plan-timeline-0 .main-svg", timeout=TIMEOUT_MS)
    assert offline_page.blocked == [] and offline_page.console_errors == []


def test_a_plan_off_the_frontier_is_drawn_apart(live_server: LiveServer,
                                               offline_page: OfflinePage) -> None:
    frontier = httpx.post(f"{live_server.url}/v1/plans/pareto", timeout=120, json={
        "scenario": priced(), "options": {"time_limit_s": 1}}).json()["frontier"]
    # The slow GPU alone priced as the fast one: 166.67 samples/s at $4/hour, dominated by
    # the fast GPU alone (333.33 samples/s at $4/hour).
    scenario = priced(fast_nodes=0)
    scenario["gpu_types"]["S"]["hourly_usd"] = 4.0
    slower = httpx.post(f"{live_server.url}/v1/plans", timeout=120, json={
        "scenario": scenario, "options": {"time_limit_s": 1}}).json()
    ids = [p["plan_id"] for p in frontier] + [slower["id"]]
    page = offline_page.page
    page.goto(f"{live_server.url}/ui/frontier?plans={','.join(ids)}")
    page.wait_for_selector("#frontier .main-svg", timeout=TIMEOUT_MS)
    traces = page.evaluate("() => document.getElementById('frontier').data"
                           ".map(t => [t.name, Array.from(t.customdata).map(c => c[0])])")
    assert traces == [["frontier", [f"plans/{i}" for i in ids[:-1]]],
                      ["dominated", [f"plans/{ids[-1]}"]]]
    assert offline_page.blocked == [] and offline_page.console_errors == []


def test_hetplan_pareto_html_works_offline_and_a_click_shows_the_points_plan(
        tmp_path: Path, offline_page: OfflinePage) -> None:
    scenario = tmp_path / "priced.json"
    scenario.write_text(json.dumps(priced()))
    target = tmp_path / "frontier.html"
    result = CliRunner().invoke(app, ["pareto", str(scenario), "--json", "--jobs", "1",
                                      "--time-limit", "1", "--html", str(target)])
    assert result.exit_code == 0, result.output
    fleets = [p["fleet"] for p in json.loads(result.stdout)["frontier"]]
    page = offline_page.page
    page.goto(target.as_uri())
    click_point(offline_page, 2)
    page.wait_for_url(f"{target.as_uri()}#point-2", timeout=TIMEOUT_MS)
    assert page.inner_text("#point-2 h2") == f"point 2: {fleets[2]}"
    page.wait_for_selector("#point-2-timeline-0 .main-svg", timeout=TIMEOUT_MS)
    assert offline_page.blocked == [] and offline_page.console_errors == []
