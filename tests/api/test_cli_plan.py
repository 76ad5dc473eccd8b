"""`hetplan plan` and `hetplan evaluate` from the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import api.cli as cli
from api.cli import app

DATA = Path(__file__).parent.parent / "data"
SCENARIO = DATA / "scenarios" / "a80x16-v32x16-gpt1.3b.json"
REFERENCE = DATA / "reference"

runner = CliRunner()


def test_plan_writes_a_valid_plan_and_prints_a_summary(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    result = runner.invoke(app, ["plan", str(SCENARIO), "-o", str(out), "--time-limit", "3"])
    assert result.exit_code == 0, result.output
    assert "samples/s" in result.output and "baseline homogeneous" in result.output
    document = json.loads(out.read_text())
    assert document["format"] == "hetplan-plan/1"
    assert document["search"]["status"] in {"feasible", "heuristic"}
    check = runner.invoke(app, ["evaluate", str(SCENARIO), str(out), "--json"])
    assert check.exit_code == 0, check.output
    numbers = json.loads(check.stdout)
    assert numbers["valid"] is True
    assert abs(numbers["iteration_s"] - document["estimate"]["iteration_s"]) < 1e-9


def test_plan_reads_yaml_scenarios(tmp_path: Path) -> None:
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump(json.loads(SCENARIO.read_text())))
    result = runner.invoke(app, ["plan", str(scenario), "--time-limit", "2"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["format"] == "hetplan-plan/1"


def test_evaluate_json_has_iteration_time_at_top_level() -> None:
    plan = REFERENCE / "a80x16-v32x16-gpt1.3b.homogeneous.plan.json"
    expected = json.loads((REFERENCE / "a80x16-v32x16-gpt1.3b.homogeneous.expected.json").read_text())
    result = runner.invoke(app, ["evaluate", str(SCENARIO), str(plan), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["iteration_s"] == expected["iteration_s"]


def test_evaluate_of_an_invalid_plan_lists_every_problem_and_fails(tmp_path: Path) -> None:
    plan = json.loads((REFERENCE / "a80x16-v32x16-gpt1.3b.homogeneous.plan.json").read_text())
    plan["pipelines"][1]["stages"][0]["gpus"] = plan["pipelines"][0]["stages"][0]["gpus"]
    plan["pipelines"][2]["num_micro_batches"] = 99
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(plan))
    result = runner.invoke(app, ["evaluate", str(SCENARIO), str(path)])
    assert result.exit_code == 1
    assert "already used" in result.output and "global batch" in result.output


def test_plan_of_an_invalid_scenario_names_the_field_not_a_traceback(tmp_path: Path) -> None:
    document = json.loads(SCENARIO.read_text())
    document["cluster"]["nodes"][0]["gpus"] = 0
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document))
    result = runner.invoke(app, ["plan", str(path)])
    assert result.exit_code == 2
    assert "cluster.nodes[0].gpus" in result.output
    assert "Traceback" not in result.output


def test_plan_of_a_file_that_is_not_json_says_so(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    result = runner.invoke(app, ["plan", str(path)])
    assert result.exit_code == 2
    assert "not valid JSON/YAML" in result.output


def test_plan_document_and_summary_carry_the_price(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    result = runner.invoke(app, ["plan", str(SCENARIO), "-o", str(out), "--time-limit", "2"])
    assert result.exit_code == 0, result.output
    assert "/hour for the GPUs used" in result.output
    estimate = json.loads(out.read_text())["estimate"]
    check = json.loads(runner.invoke(app, ["evaluate", str(SCENARIO), str(out), "--json"]).stdout)
    for key in ("usd_per_hour", "usd_per_million_tokens", "usd_per_iteration"):
        assert estimate[key] == check[key] > 0


def test_evaluate_json_of_an_interleaved_plan_has_its_chunks_and_price() -> None:
    name = "a80x16-v32x16-gpt1.3b.interleaved"
    expected = json.loads((REFERENCE / f"{name}.random2.expected.json").read_text())
    result = runner.invoke(app, ["evaluate", str(REFERENCE / f"{name}.json"),
                                 str(REFERENCE / f"{name}.random2.plan.json"), "--json"])
    assert result.exit_code == 0, result.output
    numbers = json.loads(result.stdout)
    assert numbers["usd_per_hour"] == expected["usd_per_hour"]
    assert numbers["pipelines"][2]["stages"][0]["chunks"] == \
        expected["pipelines"][2]["stages"][0]["chunks"]


def test_evaluate_summary_shows_chunks_recomputation_and_the_local_warning() -> None:
    name = "a80x16-v32x16-gpt1.3b"
    interleaved = runner.invoke(app, ["evaluate", str(REFERENCE / f"{name}.interleaved.json"),
                                      str(REFERENCE / f"{name}.interleaved.random2.plan.json")],
                                terminal_width=400)
    assert interleaved.exit_code == 0, interleaved.output
    assert "A100-80G tp1 [0,2)+[5,7)+[17,23)" in interleaved.output
    assert "[3,5)+[11,17)+[24,26) R" in interleaved.output
    local = runner.invoke(app, ["evaluate", str(REFERENCE / f"{name}.local.json"),
                                str(REFERENCE / f"{name}.local.random1.plan.json")],
                          terminal_width=400)
    assert local.exit_code == 0, local.output
    assert "not end-to-end backpropagation" in local.output


def test_plan_with_schedules_and_recompute_gives_a_valid_plan_of_an_allowed_schedule(
        tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    result = runner.invoke(app, ["plan", str(SCENARIO), "-o", str(out), "--time-limit", "2",
                                 "--schedules", "1f1b,interleaved-1f1b", "--recompute"])
    assert result.exit_code == 0, result.output
    document = json.loads(out.read_text())
    assert document["schedule"] in {"1f1b", "interleaved-1f1b"}
    check = runner.invoke(app, ["evaluate", str(SCENARIO), str(out), "--json"])
    assert check.exit_code == 0, check.output


def test_plan_caps_a_local_jobs_blocks(tmp_path: Path) -> None:
    from bench.schedules import with_local_head

    scenario = tmp_path / "local.json"
    scenario.write_text(json.dumps(with_local_head(json.loads(SCENARIO.read_text()))))
    depths = {}
    for cap in (None, 2):
        out = tmp_path / f"plan-{cap}.json"
        result = runner.invoke(app, ["plan", str(scenario), "-o", str(out), "--time-limit", "3",
                                     *([] if cap is None else ["--max-local-blocks", str(cap)])])
        assert result.exit_code == 0, result.output
        document = json.loads(out.read_text())
        assert document["schedule"] == "local"
        depths[cap] = {len(p["stages"]) for p in document["pipelines"]}
        check = runner.invoke(app, ["evaluate", str(scenario), str(out), "--json"])
        assert check.exit_code == 0 and json.loads(check.stdout)["valid"] is True
    assert max(depths[None]) > 2 >= max(depths[2])  # the cap bound a plan that went deeper
    refused = runner.invoke(app, ["plan", str(scenario), "--max-local-blocks", "0"])
    assert refused.exit_code == 2 and "--max-local-blocks" in refused.output


def test_a_block_cap_and_exact_mode_go_to_the_server_as_its_options() -> None:
    from api.cli.plan_commands import ScheduleChoice

    assert ScheduleChoice(schedules=(), recompute=False, max_local_blocks=3,
                          exact=True).as_request() == {"max_local_blocks": 3, "exact": True}
    assert ScheduleChoice(schedules=(), recompute=False).as_request() == {}


def test_plan_exact_returns_the_proven_optimum_and_refuses_what_it_cannot_enumerate(
        tmp_path: Path) -> None:
    tiny = DATA / "tiny" / "tiny-v32x4-t4x2-gpt350m-6l.json"
    optimum = json.loads(tiny.with_name(f"{tiny.stem}.optimum.json").read_text())
    result = runner.invoke(app, ["plan", str(tiny), "--exact", "--json", "--time-limit", "10",
                                 "-o", str(tmp_path / "plan.json")])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert answer["status"] == "optimal"
    assert answer["samples_per_s"] == pytest.approx(optimum["samples_per_s"], rel=1e-9)
    refused = runner.invoke(app, ["plan", str(SCENARIO), "--exact"])
    assert refused.exit_code != 0
    assert "exact mode enumerates at most 16 GPUs and this cluster has 32" in refused.output


def test_plan_with_an_unknown_schedule_names_the_known_ones() -> None:
    result = runner.invoke(app, ["plan", str(SCENARIO), "--schedules", "1f1b,zb-v"])
    assert result.exit_code == 2
    assert "zb-v" in result.output and "interleaved-1f1b" in result.output


def test_plan_for_a_launcher_writes_a_plan_that_launcher_runs(tmp_path: Path) -> None:
    from planner import parse_plan
    from planner.export import expressible

    scenario = DATA / "scenarios" / "l40sx16-a40x8-v32x16-t4x8-gpt2.7b.json"
    out = tmp_path / "plan.json"
    result = runner.invoke(app, ["plan", str(scenario), "-o", str(out), "--time-limit", "3",
                                 "--launcher", "deepspeed"])
    assert result.exit_code == 0, result.output
    assert expressible(parse_plan(json.loads(out.read_text())), "deepspeed") is None


def test_plan_for_an_unknown_launcher_names_the_known_ones() -> None:
    result = runner.invoke(app, ["plan", str(SCENARIO), "--launcher", "ray-train"])
    assert result.exit_code == 2
    assert "ray-train" in result.output and "megatron" in result.output


def test_evaluate_summary_shows_identical_consecutive_pipelines_as_one_row(tmp_path: Path
                                                                          ) -> None:
    """A 512-GPU plan's replicas read as one row, `first-last`, not one row each."""
    doc = json.loads(SCENARIO.read_text())
    a100 = [n["name"] for n in doc["cluster"]["nodes"] if n["gpu_type"] == "A100-80G"]
    one = {"micro_batch_size": 2, "num_micro_batches": 16, "stages": []}
    plan = {"format": "hetplan-plan/1", "pipelines": [
        {**one, "stages": [{"gpu_type": "A100-80G", "tp": 1, "gpus": [f"{node}:{g}"],
                            "layers": [0, 26]}]}
        for node in a100 for g in range(8)]}
    plan["pipelines"][-1] |= {"micro_batch_size": 4, "num_micro_batches": 8}  # reads apart
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    result = runner.invoke(app, ["evaluate", str(SCENARIO), str(path)])
    assert "0-14" in result.output and "│ 15 " in result.output
    assert "[layers]" in result.output  # the header is not taken for markup


def test_replicas_placed_apart_share_a_row_with_their_time_range() -> None:
    from api.cli.plan_commands import _pipeline_rows

    def pipeline(index: int, t_p: float, tp: int = 1) -> dict:
        stage = {"gpu_type": "A100-80G", "tp": tp, "layers": [0, 4], "memory_gib": 20.0,
                 "capacity_gib": 78.0}
        return {"index": index, "micro_batch_size": 2, "num_micro_batches": 8, "T_p": t_p,
                "stages": [stage]}

    rows = _pipeline_rows([pipeline(0, 1.7004), pipeline(1, 1.6981), pipeline(2, 1.7),
                           pipeline(3, 1.7, tp=2), pipeline(4, 1.7)])
    assert [indices for indices, _ in rows] == [[0, 1, 2], [3], [4]]
    assert [cells[2] for _, cells in rows] == ["1.698-1.700", "1.700", "1.700"]


class _Exited(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


def _run_console_script(monkeypatch: pytest.MonkeyPatch, *args: str) -> int | None:
    """`main()` as the console script runs it, with `os._exit` caught: its code, or None
    where the process would have gone through Python's own shutdown."""
    def caught(code: int) -> None:
        raise _Exited(code)

    monkeypatch.setattr(cli.os, "_exit", caught)
    monkeypatch.setattr(sys, "argv", ["hetplan", *args])
    try:
        cli.main()
    except _Exited as exited:
        return exited.code
    except SystemExit:
        return None
    raise AssertionError("main() returned instead of exiting")


def test_plan_and_evaluate_end_the_process_at_once_with_their_exit_codes(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    assert _run_console_script(monkeypatch, "plan", str(SCENARIO), "-o", str(out),
                               "--time-limit", "2") == 0
    assert json.loads(out.read_text())["format"] == "hetplan-plan/1"  # written before the exit
    assert _run_console_script(monkeypatch, "plan", str(tmp_path / "missing.json")) == 2
    bad = json.loads(out.read_text())
    bad["pipelines"][0]["num_micro_batches"] += 1
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    assert _run_console_script(monkeypatch, "evaluate", str(SCENARIO),
                               str(tmp_path / "bad.json")) == 1
    # A command that did not say it holds nothing to clean goes through Python's shutdown,
    # whatever ran before it in this process.
    assert _run_console_script(monkeypatch, "schema", "--help") is None


def test_plan_output_arrives_whole_through_a_pipe(tmp_path: Path) -> None:
    """The console script in its own process, stdout a pipe (block-buffered): the plan
    document and the exit code survive the process ending without Python's shutdown."""
    done = subprocess.run(
        [sys.executable, "-c", "from api.cli import main; main()", "plan", str(SCENARIO),
         "--time-limit", "2", "--json"], capture_output=True, text=True, timeout=120,
        cwd=Path(__file__).parent.parent.parent)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["plan"]["format"] == "hetplan-plan/1" and answer["status"]
