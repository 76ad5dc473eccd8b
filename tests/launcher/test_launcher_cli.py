"""`hetplan rankmap`, `hetplan export` and `hetplan launch` from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from api.cli import app

DATA = Path(__file__).parent / "data"
SMALL = DATA / "a40x32-t4x32-l4x16-gpt2.7b.onenic.random0.plan.json"
MIXED = DATA / "a80x16-v32x16-gpt1.3b.gpipe.random1.plan.json"

runner = CliRunner()


def test_rankmap_prints_json_with_every_gpu() -> None:
    result = runner.invoke(app, ["rankmap", str(SMALL)])
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    assert [r["gpu"] for r in got["ranks"]] == ["a40-1:0", "a40-1:1", "a40-1:2", "a40-1:3"]
    assert got["tp_groups"] == [{"pipeline": 0, "stage": 0, "ranks": [0, 1, 2, 3]}]


def test_export_writes_the_format(tmp_path: Path) -> None:
    out = tmp_path / "megatron.json"
    result = runner.invoke(app, ["export", str(SMALL), "--format", "megatron",
                                 "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["tensor_model_parallel_size"] == 4


def test_export_torchrun_takes_the_rendezvous_address() -> None:
    result = runner.invoke(app, ["export", str(SMALL), "-f", "torchrun", "--master-addr",
                                 "head.local", "--master-port", "7000"])
    assert result.exit_code == 0, result.output
    assert "--master-addr=head.local --master-port=7000" in json.loads(result.stdout)[
        "nodes"][0]["command"]


def test_export_that_the_format_cannot_express_exits_3_with_reasons() -> None:
    result = runner.invoke(app, ["export", str(MIXED), "--format", "deepspeed"])
    assert result.exit_code == 3
    assert "cannot be exported as deepspeed" in result.stderr
    assert "mixed TP degrees [1, 2, 4, 8]" in result.stderr


def test_export_reads_layer_kinds_from_the_scenario(tmp_path: Path) -> None:
    scenario = json.loads((DATA / "tiny-scenario.json").read_text())
    scenario["model"]["layers"] = ["block"] * 4
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(scenario))
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"pipelines": [{"micro_batch_size": 1, "num_micro_batches": 1,
                                               "stages": [{"gpu_type": "cpu", "tp": 1,
                                                           "gpus": ["n:0"],
                                                           "layers": [0, 4]}]}]}))
    result = runner.invoke(app, ["export", str(plan), "-f", "megatron", "--scenario", str(path)])
    assert result.exit_code == 3
    assert "layer kinds" in result.stderr


def test_launch_refuses_more_processes_than_allowed() -> None:
    result = runner.invoke(app, ["launch", str(MIXED), "--max-processes", "4"])
    assert result.exit_code == 2
    assert "30 GPUs" in result.stderr


def test_launch_logs_steps_and_checks_against_one_process(tmp_path: Path) -> None:
    # One process keeps this CLI test cheap; test_launcher_equivalence launches the
    # multi-process plans.
    pytest.importorskip("torch")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"schedule": "gpipe", "pipelines": [
        {"micro_batch_size": 2, "num_micro_batches": 2,
         "stages": [{"gpu_type": "cpu", "tp": 1, "gpus": ["n:0"], "layers": [0, 4]}]},
    ]}))
    result = runner.invoke(app, ["launch", str(plan), "--steps", "2", "--check", "--json",
                                 "--cpu-threads", "1"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [line["step"] for line in lines[:2]] == [0, 1]
    assert all(line["step_s"] > 0 and line["loss"] > 0 for line in lines[:2])
    assert lines[2]["max_weight_difference"] < 1e-6


def test_launch_runs_an_interleaved_recomputing_plan_and_refuses_a_broken_one(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torch")
    stage = {"gpu_type": "cpu", "tp": 1, "gpus": ["n:0"], "chunks": [[0, 2], [2, 4]],
             "recompute": True}
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"schedule": "interleaved-1f1b", "pipelines": [
        {"micro_batch_size": 2, "num_micro_batches": 2, "stages": [stage]}]}))
    result = runner.invoke(app, ["launch", str(plan), "--steps", "1", "--check", "--json",
                                 "--cpu-threads", "1"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert lines[-1]["max_weight_difference"] < 1e-6

    # The same chunks under 1f1b: refused before any process starts, saying why.
    result = runner.invoke(app, ["launch", str(plan), "--schedule", "1f1b"])
    assert result.exit_code == 2
    assert "chunks run under 'interleaved-1f1b' only" in result.stderr


def _two_node_plan() -> dict[str, object]:
    return {"pipelines": [
        {"micro_batch_size": 1, "num_micro_batches": 1, "stages": [
            {"gpu_type": "cpu", "tp": 1, "gpus": ["b:3"], "layers": [0, 2]},
            {"gpu_type": "cpu", "tp": 2, "gpus": ["a:1", "a:0"], "layers": [2, 4]}]}]}


def test_torchrun_worker_accepts_the_exported_numbering() -> None:
    pytest.importorskip("torch")
    from launcher.train import check_torchrun_placement
    from planner import parse_plan
    from planner.export import build_rank_map

    ranks = build_rank_map(parse_plan(_two_node_plan()))
    # Node a runs 2 processes as --node-rank=1; local rank 0 is a:0, which is TP rank 1.
    check_torchrun_placement(ranks, {"RANK": "1", "WORLD_SIZE": "3", "LOCAL_RANK": "0",
                                     "GROUP_RANK": "1"})
    assert ranks.ranks[1].gpu == "a:0" and ranks.ranks[1].tp_rank == 1


def test_torchrun_worker_numbered_by_another_rendezvous_is_stopped() -> None:
    pytest.importorskip("torch")
    from launcher.train import check_torchrun_placement
    from planner import parse_plan
    from planner.export import build_rank_map

    ranks = build_rank_map(parse_plan(_two_node_plan()))
    with pytest.raises(RuntimeError, match="torchrun started it as node_rank 1"):
        check_torchrun_placement(ranks, {"RANK": "0", "WORLD_SIZE": "3", "LOCAL_RANK": "0",
                                         "GROUP_RANK": "1"})
    with pytest.raises(RuntimeError, match="the plan has 3 GPUs"):
        check_torchrun_placement(ranks, {"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0"})


def test_rankmap_of_a_file_that_is_not_json_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text("{not json")
    result = runner.invoke(app, ["rankmap", str(path)])
    assert result.exit_code == 2
    assert "not valid JSON/YAML" in result.stderr


def test_rankmap_of_an_invalid_plan_lists_the_problem(tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text("pipelines:\n- micro_batch_size: 1\n  num_micro_batches: 1\n  stages:\n"
                    "  - {gpu_type: g, tp: 2, gpus: ['a:0'], layers: [0, 2]}\n")
    result = runner.invoke(app, ["rankmap", str(path)])
    assert result.exit_code == 2
    assert "list exactly tp GPUs" in result.stderr
