"""`hetplan pareto`, `hetplan whatif`, `hetplan plan --objective` and `hetplan batch --ray`."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from api.cli import app
from tests.planner.fleet_scenarios import priced

runner = CliRunner()
HAS_RAY = importlib.util.find_spec("ray") is not None
BOTH = 4 / 0.0094  # both GPUs of the priced scenario (see tests/planner/test_fleet.py)


@pytest.fixture
def scenario_path(tmp_path: Path) -> Path:
    path = tmp_path / "priced.json"
    path.write_text(json.dumps(priced()))
    return path


def test_pareto_json_lists_valid_plans_cheapest_first(scenario_path: Path) -> None:
    result = runner.invoke(app, ["pareto", str(scenario_path), "--json", "--jobs", "1",
                                 "--time-limit", "1"])
    assert result.exit_code == 0, result.output
    frontier = json.loads(result.stdout)["frontier"]
    assert [p["usd_per_hour"] for p in frontier] == [1.0, 4.0, 5.0]
    assert all(p["plan"]["format"] == "hetplan-plan/1" for p in frontier)
    assert frontier[-1]["samples_per_s"] == pytest.approx(BOTH)


def test_pareto_table_names_each_fleet(scenario_path: Path) -> None:
    result = runner.invoke(app, ["pareto", str(scenario_path), "--jobs", "1", "--time-limit", "1"])
    assert result.exit_code == 0, result.output
    assert "3 points from 3 fleets planned" in result.stdout and "S 1/1 nodes" in result.stdout


def test_whatif_flags_make_one_variant_against_the_base(scenario_path: Path) -> None:
    result = runner.invoke(app, ["whatif", str(scenario_path), "--add", "S:1x1",
                                 "--remove-type", "F", "--json", "--jobs", "1"])
    assert result.exit_code == 0, result.output
    base, variant = json.loads(result.stdout)["rows"]
    assert variant["name"] == "+S:1x1 -F" and variant["num_gpus"] == 2
    assert variant["samples_per_s"] == pytest.approx(4 / 0.0124)
    assert variant["samples_per_s_change"] == pytest.approx((4 / 0.0124) / BOTH - 1)


def test_whatif_sweep_file_lists_variants(scenario_path: Path, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("variants:\n  - {name: cheap, remove_types: [F]}\n"
                     "  - {name: slow net, inter_node: {bandwidth_gb_per_s: 1}}\n")
    result = runner.invoke(app, ["whatif", str(scenario_path), "--sweep", str(sweep),
                                 "--jobs", "1"])
    assert result.exit_code == 0, result.output
    assert "cheap" in result.stdout and "slow net" in result.stdout and "-80.0%" in result.stdout


def test_whatif_without_a_change_says_what_to_give(scenario_path: Path) -> None:
    result = runner.invoke(app, ["whatif", str(scenario_path)])
    assert result.exit_code == 2
    assert "--sweep" in result.output


def test_whatif_add_in_a_bad_form_shows_the_expected_form(scenario_path: Path) -> None:
    result = runner.invoke(app, ["whatif", str(scenario_path), "--add", "S-two"])
    assert result.exit_code == 2
    assert "TYPE:NODESxGPUS" in result.output


def test_plan_cost_objective_writes_the_cheapest_per_token_plan(scenario_path: Path) -> None:
    result = runner.invoke(app, ["plan", str(scenario_path), "--objective", "cost",
                                 "--time-limit", "1"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["estimate"]["usd_per_hour"] == 1.0
    assert document["search"]["objective"] == "cost"


def test_plan_budget_no_plan_meets_exits_2_naming_the_closest(scenario_path: Path) -> None:
    result = runner.invoke(app, ["plan", str(scenario_path), "--max-usd-per-hour", "0.5",
                                 "--time-limit", "1"])
    assert result.exit_code == 2
    assert "166.7 samples/s at $1/hour" in " ".join(result.output.split())


def test_plan_unknown_objective_is_refused(scenario_path: Path) -> None:
    result = runner.invoke(app, ["plan", str(scenario_path), "--objective", "speed"])
    assert result.exit_code == 2
    assert "throughput, cost" in result.output


@pytest.mark.skipif(not HAS_RAY, reason="Ray is not installed (pip install 'hetplan[ray]')")
def test_batch_on_local_ray_writes_the_plans_local_processes_write(
        scenario_path: Path, tmp_path: Path) -> None:
    folder = scenario_path.parent
    (folder / "more.json").write_text(json.dumps(priced(2, 1)))
    plans = {}
    for name, extra in (("local", []), ("ray", ["--ray", "auto"])):
        out = tmp_path / name
        result = runner.invoke(app, ["batch", str(folder), "--out", str(out), "--jobs", "2",
                                     "--time-limit", "1", *extra])
        assert result.exit_code == 0, result.output
        plans[name] = {p.name: json.loads(p.read_text())["pipelines"]
                       for p in sorted(out.glob("*.plan.json"))}
    assert plans["ray"] == plans["local"] and len(plans["local"]) == 2
