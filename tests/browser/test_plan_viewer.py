"""The plan viewer in a real browser with the network cut: the charts render, each
pipeline timeline has one row per stage (version 1.1 schedules too), and the page logs
no errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from typer.testing import CliRunner

from api.cli import app
from api.examples import STORY
from tests.browser.conftest import LiveServer, OfflinePage
from tests.planner.scenarios import deep
from tests.planner.test_estimate_schedules import interleaved_two_by_two

ROOT = Path(__file__).parents[2]
TIMEOUT_MS = 30_000
TIMELINE_ROWS = """ids => ids.map(id => new Set(document.getElementById(id).data
    .flatMap(trace => Array.from(trace.y))).size)"""


def stored_plan(server: LiveServer) -> dict[str, Any]:
    """The README's story posted in order: the last answer is the plan."""
    answers = [httpx.post(f"{server.url}{step.path}", json=step.body, timeout=60)
               for step in STORY]
    assert answers[-1].status_code == 201, answers[-1].text
    return dict(answers[-1].json())


def distinct_stage_counts(plan: dict[str, Any]) -> list[int]:
    """Stages of each distinct pipeline, in plan order (replicas drawn once)."""
    seen: dict[tuple[Any, ...], int] = {}
    for p in plan["evaluation"]["pipelines"]:
        key = (p["micro_batch_size"], p["num_micro_batches"], p["schedule"], tuple(
            (s["gpu_type"], s["tp"], tuple(s["layers"]), s["effective_forward_ms"],
             s["effective_backward_ms"]) for s in p["stages"]))
        seen.setdefault(key, len(p["stages"]))
    return list(seen.values())


def timeline_rows(offline: OfflinePage, prefix: str) -> list[int]:
    page = offline.page
    page.wait_for_selector(f"#{prefix}-timeline-0 .main-svg", timeout=TIMEOUT_MS)
    ids = page.eval_on_selector_all(f"[id^='{prefix}-timeline-']",
                                    "nodes => nodes.map(n => n.id)")
    return list(page.evaluate(TIMELINE_ROWS, ids))


def test_a_stored_plan_is_drawn_with_one_timeline_row_per_stage(
        live_server: LiveServer, offline_page: OfflinePage) -> None:
    plan = stored_plan(live_server)
    offline_page.page.goto(f"{live_server.url}/ui/plans/{plan['id']}")
    assert timeline_rows(offline_page, "plan") == distinct_stage_counts(plan)
    offline_page.page.wait_for_selector("#plan-memory .main-svg", timeout=TIMEOUT_MS)
    offline_page.page.wait_for_selector("#plan-baselines .main-svg", timeout=TIMEOUT_MS)
    text = offline_page.page.inner_text("body")
    assert "cost per hour" in text and "idle GPUs" in text
    assert offline_page.blocked == []
    assert offline_page.console_errors == []


def test_two_plans_side_by_side(live_server: LiveServer, offline_page: OfflinePage) -> None:
    first = stored_plan(live_server)
    second = httpx.post(f"{live_server.url}/v1/plans", json={**STORY[-1].body,
                        "job": {"global_batch_size": 256, "grad_bytes": 2}}, timeout=60).json()
    offline_page.page.goto(f"{live_server.url}/ui/compare?a={first['id']}&b={second['id']}")
    assert timeline_rows(offline_page, "a") == distinct_stage_counts(first)
    assert timeline_rows(offline_page, "b") == distinct_stage_counts(second)
    assert offline_page.blocked == [] and offline_page.console_errors == []


def test_hetplan_show_writes_a_page_that_works_offline(tmp_path: Path,
                                                      offline_page: OfflinePage) -> None:
    target = tmp_path / "plan.html"
    result = CliRunner().invoke(app, ["show", str(ROOT / "tests/api/data/plan.json"),
                                      "--scenario", str(ROOT / "tests/api/data/scenario.json"),
                                      "--html", str(target)])
    assert result.exit_code == 0, result.output
    offline_page.page.goto(target.as_uri())
    assert timeline_rows(offline_page, "plan") == [2]
    assert offline_page.blocked == [] and offline_page.console_errors == []


def test_an_interleaved_recomputing_plan_is_drawn_offline(tmp_path: Path,
                                                          offline_page: OfflinePage) -> None:
    scenario, target = tmp_path / "scenario.json", tmp_path / "plan.json"
    scenario.write_text(json.dumps(deep(4)))
    target.write_text(json.dumps(interleaved_two_by_two(recompute=True)))
    result = CliRunner().invoke(app, ["show", str(target), "--scenario", str(scenario)])
    assert result.exit_code == 0, result.output
    offline_page.page.goto(target.with_suffix(".html").as_uri())
    assert timeline_rows(offline_page, "plan") == [2]
    names = offline_page.page.evaluate(
        "() => document.getElementById('plan-timeline-0').data.map(t => t.name)")
    assert {"forward", "backward", "recompute", "transfer"} <= set(names)
    assert offline_page.blocked == [] and offline_page.console_errors == []
