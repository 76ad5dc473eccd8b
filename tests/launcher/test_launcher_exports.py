"""Exports: golden files per format, and the rejections a format must give.

Golden files live in tests/launcher/golden/ and are reviewed as diffs. To rewrite
them after a deliberate change: HETPLAN_UPDATE_GOLDEN=1 pytest tests/launcher.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from planner import InvalidPlan, UnsupportedExport, parse_plan
from planner.documents import Plan
from planner.export import FORMATS, build_rank_map, export_plan, expressible, rank_map

HERE = Path(__file__).parent
DATA, GOLDEN = HERE / "data", HERE / "golden"
UPDATE = os.environ.get("HETPLAN_UPDATE_GOLDEN") == "1"
PLANS = sorted(DATA.glob("*.plan.json"))


def _stem(path: Path) -> str:
    return path.name.removesuffix(".plan.json")


def _export_or_reasons(plan: Plan, fmt: str) -> dict[str, Any]:
    try:
        return export_plan(plan, fmt)
    except UnsupportedExport as error:
        return {"unsupported": fmt, "reasons": error.reasons}


def _check_golden(name: str, got: dict[str, Any]) -> None:
    path = GOLDEN / name
    text = json.dumps(got, indent=2, sort_keys=True) + "\n"
    if UPDATE:
        path.write_text(text)
    assert path.exists(), f"no golden file {path}; run with HETPLAN_UPDATE_GOLDEN=1 and review it"
    assert json.loads(path.read_text()) == json.loads(text)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("path", PLANS, ids=_stem)
def test_export_matches_golden(path: Path, fmt: str) -> None:
    plan = parse_plan(json.loads(path.read_text()))
    _check_golden(f"{_stem(path)}.{fmt}.json", _export_or_reasons(plan, fmt))


@pytest.mark.parametrize("path", [p for p in PLANS if "random0" in p.name], ids=_stem)
def test_rank_map_matches_golden(path: Path) -> None:
    plan = parse_plan(json.loads(path.read_text()))
    _check_golden(f"{_stem(path)}.rankmap.json", rank_map(plan))


def _plan(*pipelines: tuple[int, int, list[tuple[int, list[str], int, int]]],
          schedule: str | None = None) -> Plan:
    """Pipelines as (micro_batch_size, num_micro_batches, [(tp, gpus, start, end), ...])."""
    return parse_plan({
        "schedule": schedule,
        "pipelines": [
            {"micro_batch_size": b, "num_micro_batches": m,
             "stages": [{"gpu_type": "g", "tp": tp, "gpus": gpus, "layers": [start, end]}
                        for tp, gpus, start, end in stages]}
            for b, m, stages in pipelines
        ],
    })


# 10 layers: embedding, 8 blocks, head.
ASYMMETRIC = _plan(
    (2, 4, [(2, ["a:0", "a:1"], 0, 4), (1, ["a:2"], 4, 10)]),
    (1, 4, [(1, ["b:0"], 0, 6), (1, ["b:1"], 6, 8), (1, ["b:2"], 8, 10)]),
    schedule="gpipe",
)


@pytest.mark.parametrize("fmt", ["megatron", "deepspeed"])
def test_asymmetric_plan_is_rejected_with_every_reason(fmt: str) -> None:
    with pytest.raises(UnsupportedExport) as caught:
        export_plan(ASYMMETRIC, fmt)
    text = "\n".join(caught.value.reasons)
    for expected in ("mixed TP degrees [1, 2]", "pipelines of different depths [2, 3]",
                     "mixed micro-batch sizes [2, 1]", "schedule 'gpipe'"):
        assert expected in text
    assert caught.value.format == fmt


def test_identical_pipelines_with_different_splits_are_rejected_as_asymmetric() -> None:
    plan = _plan((1, 4, [(1, ["a:0"], 0, 3), (1, ["a:1"], 3, 6)]),
                 (1, 4, [(1, ["a:2"], 0, 4), (1, ["a:3"], 4, 6)]))
    with pytest.raises(UnsupportedExport, match=r"stage boundaries differ \[\[3\], \[4\]\]"):
        export_plan(plan, "megatron")


def test_pipelining_rejects_mixed_tp_inside_a_pipeline_only() -> None:
    with pytest.raises(UnsupportedExport, match=r"pipelines\[0\] mixes TP degrees \[2, 1\]"):
        export_plan(ASYMMETRIC, "pipelining")
    mixed_across = _plan((1, 2, [(2, ["a:0", "a:1"], 0, 10)]), (2, 1, [(1, ["b:0"], 0, 10)]))
    got = export_plan(mixed_across, "pipelining")
    assert [p["stages"][0]["tp_size"] for p in got["pipelines"]] == [2, 1]
    assert got["gradient_sync"][0]["kind"] == "resharded"


def test_pipelining_names_schedule_classes_and_split_points() -> None:
    plan = _plan((1, 4, [(1, ["a:0"], 0, 3), (1, ["a:1"], 3, 10)]),
                 (2, 2, [(1, ["b:0"], 0, 10)]), schedule="1f1b")
    got = export_plan(plan, "pipelining")
    first, second = got["pipelines"]
    assert first["schedule_class"] == "Schedule1F1B"
    assert first["split_points"] == [3]
    assert first["stages"][0]["module_names"] == ["tok_embeddings", "layers.0", "layers.1"]
    assert first["stages"][1]["module_names"][-2:] == ["norm", "lm_head"]
    assert second["split_points"] == []
    assert first["batch_share"] == 0.5
    gpipe = export_plan(_plan((1, 1, [(1, ["a:0"], 0, 2)]), schedule="gpipe"), "pipelining")
    assert gpipe["pipelines"][0]["schedule_class"] == "ScheduleGPipe"


def test_megatron_uneven_split_uses_first_and_last_stage_counts() -> None:
    # Blocks per stage 3, 2, 2, 1 (embedding on the first stage, head on the last).
    plan = _plan((1, 8, [(1, ["a:0"], 0, 4), (1, ["a:1"], 4, 6), (1, ["a:2"], 6, 8),
                         (1, ["a:3"], 8, 10)]))
    got = export_plan(plan, "megatron")
    assert got["blocks_per_stage"] == [3, 2, 2, 1]
    assert got["args"][-4:] == ["--decoder-first-pipeline-num-layers", "3",
                                "--decoder-last-pipeline-num-layers", "1"]
    assert got["pipeline_model_parallel_layout"] == "Ettt|tt|tt|tL"


def test_megatron_stage_without_blocks_needs_the_layout_flag() -> None:
    plan = _plan((1, 8, [(1, ["a:0"], 0, 1), (1, ["a:1"], 1, 9), (1, ["a:2"], 9, 10)]))
    got = export_plan(plan, "megatron")
    assert got["args"][-2:] == ["--pipeline-model-parallel-layout", "E|tttttttt|L"]


def test_megatron_even_split_needs_no_split_flags() -> None:
    plan = _plan((4, 2, [(2, ["a:0", "a:1"], 0, 5), (2, ["a:2", "a:3"], 5, 10)]),
                 (4, 2, [(2, ["a:4", "a:5"], 0, 5), (2, ["a:6", "a:7"], 5, 10)]))
    got = export_plan(plan, "megatron")
    assert got["args"] == ["--tensor-model-parallel-size", "2",
                           "--pipeline-model-parallel-size", "2", "--num-layers", "8",
                           "--micro-batch-size", "4", "--global-batch-size", "16"]
    assert (got["data_parallel_size"], got["rank_order"]) == (2, "tp-dp-pp")


def test_megatron_switches_to_tp_pp_dp_order_when_pipelines_fill_nodes() -> None:
    # Each pipeline on its own node: only tp-pp-dp numbering gives nodes contiguous ranks.
    plan = _plan((1, 2, [(1, ["a:0"], 0, 5), (1, ["a:1"], 5, 10)]),
                 (1, 2, [(1, ["b:0"], 0, 5), (1, ["b:1"], 5, 10)]))
    got = export_plan(plan, "megatron")
    assert got["rank_order"] == "tp-pp-dp"
    assert "--use-tp-pp-dp-mapping" in got["args"]
    deepspeed = export_plan(plan, "deepspeed")
    assert deepspeed["topology"]["axes"] == ["data", "pipe", "model"]


def test_placement_that_no_rank_order_fits_is_rejected() -> None:
    # Node a holds stage 0 of pipeline 0 and stage 1 of pipeline 1: never a contiguous block.
    plan = _plan((1, 2, [(1, ["a:0"], 0, 5), (1, ["b:0"], 5, 10)]),
                 (1, 2, [(1, ["c:0"], 0, 5), (1, ["a:1"], 5, 10)]))
    with pytest.raises(UnsupportedExport, match="placement: node a"):
        export_plan(plan, "megatron")


def test_deepspeed_rejects_zero2() -> None:
    plan = _plan((1, 2, [(1, ["a:0"], 0, 4), (1, ["a:1"], 4, 10)]))
    with pytest.raises(UnsupportedExport, match="zero_stage 2"):
        export_plan(plan, "deepspeed", zero_stage=2)


def test_deepspeed_gives_an_uneven_split_as_stage_bounds() -> None:
    plan = _plan((1, 2, [(1, ["a:0"], 0, 4), (1, ["a:1"], 4, 10)]))
    module = export_plan(plan, "deepspeed")["pipeline_module"]
    assert (module["partition_method"], module["stage_bounds"]) == (None, [0, 4, 10])


def test_deepspeed_writes_ds_config_for_an_even_uniform_plan() -> None:
    plan = _plan((2, 8, [(1, ["a:0"], 0, 5), (1, ["a:1"], 5, 10)]),
                 (2, 8, [(1, ["a:2"], 0, 5), (1, ["a:3"], 5, 10)]))
    got = export_plan(plan, "deepspeed", zero_stage=1)
    assert got["ds_config"] == {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 2,
                                "gradient_accumulation_steps": 8,
                                "zero_optimization": {"stage": 1},
                                "zero_allow_untested_optimizer": True}
    assert got["pipeline_module"]["layer_counts"] == [5, 5]
    assert got["pipeline_module"]["partition_method"] == "uniform"


def test_torchrun_gives_each_node_its_processes_and_devices() -> None:
    got = export_plan(ASYMMETRIC, "torchrun", master_addr="10.0.0.1", master_port=1234)
    assert [(n["node"], n["nproc_per_node"], n["first_rank"], n["env"]["CUDA_VISIBLE_DEVICES"])
            for n in got["nodes"]] == [("a", 3, 0, "0,1,2"), ("b", 3, 3, "0,1,2")]
    assert got["nodes"][1]["command"] == (
        "CUDA_VISIBLE_DEVICES=0,1,2 torchrun --nnodes=2 --nproc-per-node=3 --node-rank=1 "
        "--rdzv-backend=static --master-addr=10.0.0.1 --master-port=1234 -m launcher.train "
        "--plan plan.json")


def test_layer_kinds_other_than_embedding_blocks_head_are_rejected() -> None:
    plan = _plan((1, 1, [(1, ["a:0"], 0, 3)]))
    with pytest.raises(UnsupportedExport, match="layer kinds"):
        export_plan(plan, "megatron", layer_kinds=["block", "block", "head"])
    with pytest.raises(ValueError, match="layer_kinds has 2 entries"):
        export_plan(plan, "megatron", layer_kinds=["embedding", "head"])


def test_unknown_format_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown export format 'mpirun'; use one of \['deepspeed'"):
        export_plan(ASYMMETRIC, "mpirun")


def test_unknown_option_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['zero_stage'\] for format"):
        export_plan(ASYMMETRIC, "torchrun", zero_stage=1)


def test_exports_do_not_import_torch() -> None:
    code = ("import sys, planner.export, api.cli.launch_commands; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_plan_without_schedule_runs_the_job_schedule() -> None:
    plan = _plan((1, 4, [(1, ["a:0"], 0, 5), (1, ["a:1"], 5, 10)]))
    assert export_plan(plan, "pipelining", job_schedule="gpipe")["pipelines"][0][
        "schedule_class"] == "ScheduleGPipe"
    with pytest.raises(UnsupportedExport, match="schedule 'gpipe'"):
        export_plan(plan, "megatron", job_schedule="gpipe")
    assumed = export_plan(plan, "megatron")
    assert any("assumed 1f1b" in note for note in assumed["notes"])
    with pytest.raises(ValueError, match="job_schedule 'zb'"):
        export_plan(plan, "deepspeed", job_schedule="zb")


def test_expressible_is_none_for_a_plan_the_format_runs_else_every_reason() -> None:
    even = _plan((2, 8, [(1, ["a:0"], 0, 5), (1, ["a:1"], 5, 10)]),
                 (2, 8, [(1, ["a:2"], 0, 5), (1, ["a:3"], 5, 10)]))
    assert expressible(even, "megatron") is None
    reasons = expressible(ASYMMETRIC, "megatron")
    assert reasons is not None
    with pytest.raises(UnsupportedExport) as caught:
        export_plan(ASYMMETRIC, "megatron")
    assert reasons.splitlines() == caught.value.reasons
    assert expressible(even, "deepspeed", zero_stage=2) == (
        "zero_stage 2; DeepSpeed's pipeline engine supports ZeRO 0 or 1")


def test_expressible_refuses_an_unknown_format_or_option() -> None:
    with pytest.raises(ValueError, match="unknown export format 'mpirun'"):
        expressible(ASYMMETRIC, "mpirun")
    with pytest.raises(ValueError, match="unknown option"):
        expressible(ASYMMETRIC, "torchrun", zero_stage=1)


def _chunked(schedule: str = "interleaved-1f1b", *, recompute: bool = False,
             num_micro_batches: int = 4) -> Plan:
    """10 layers on 2 stages of node a, two chunks each (model chunk c on stage c % 2)."""
    return parse_plan({"schedule": schedule, "pipelines": [
        {"micro_batch_size": 1, "num_micro_batches": num_micro_batches, "stages": [
            {"gpu_type": "g", "tp": 1, "gpus": ["a:0"], "chunks": [[0, 3], [5, 8]],
             "recompute": recompute},
            {"gpu_type": "g", "tp": 1, "gpus": ["a:1"], "chunks": [[3, 5], [8, 10]],
             "recompute": recompute}]}]})


def test_rank_map_carries_chunks_recompute_and_the_link_back_to_the_first_stage() -> None:
    got = rank_map(_chunked(recompute=True))
    assert got["schedule"] == "interleaved-1f1b"
    assert [(r["chunks"], r.get("recompute")) for r in got["ranks"]] == [
        ([[0, 3], [5, 8]], True), ([[3, 5], [8, 10]], True)]
    assert all("layers" not in r for r in got["ranks"])
    assert [(k["from_stage"], k["to_stage"]) for k in got["stage_links"]] == [(0, 1), (1, 0)]
    # Each layer range held by one stage is its own sync entry (here: one pipeline, no peers).
    assert [g["layers"] for g in got["sync_groups"]] == [[0, 3], [3, 5], [5, 8], [8, 10]]
    plain = rank_map(_plan((1, 2, [(1, ["a:0"], 0, 5), (1, ["a:1"], 5, 10)])))
    assert all("chunks" not in r and "recompute" not in r for r in plain["ranks"])
    assert len(plain["stage_links"]) == 1


def test_rank_map_refuses_chunks_that_do_not_follow_the_model_order() -> None:
    document = _chunked().model_dump(mode="json", exclude_none=True)
    document["pipelines"][0]["stages"][1]["chunks"] = [[8, 10], [3, 5]]
    with pytest.raises(InvalidPlan, match="model chunk 1"):
        rank_map(parse_plan(document))


def test_a_chunked_stage_has_no_single_layer_range() -> None:
    info = build_rank_map(_chunked()).ranks[0]
    assert info.chunks == ((0, 3), (5, 8))
    with pytest.raises(InvalidPlan, match="read `chunks`"):
        _ = info.layers


@pytest.mark.parametrize("fmt", ["pipelining", "megatron", "deepspeed", "torchtitan"])
def test_local_learning_is_refused_by_every_framework_naming_the_reference_launcher(
        fmt: str) -> None:
    plan = _plan((1, 4, [(1, ["a:0"], 0, 5), (1, ["a:1"], 5, 10)]), schedule="local")
    with pytest.raises(UnsupportedExport, match="no framework runs local learning"):
        export_plan(plan, fmt)


@pytest.mark.parametrize("fmt", ["torchrun", "kubernetes", "slurm"])
def test_process_launchers_start_local_and_interleaved_plans(fmt: str) -> None:
    local = _plan((1, 4, [(1, ["a:0"], 0, 5), (1, ["a:1"], 5, 10)]), schedule="local")
    assert expressible(local, fmt) is None
    assert expressible(_chunked(recompute=True), fmt) is None


def test_pipelining_lists_each_ranks_chunks_as_torch_numbers_its_stages() -> None:
    got = export_plan(_chunked(recompute=True), "pipelining")
    (pipeline,) = got["pipelines"]
    assert (pipeline["schedule_class"], pipeline["num_stages"], pipeline["chunks_per_stage"],
            pipeline["num_model_chunks"]) == ("ScheduleInterleaved1F1B", 2, 2, 4)
    assert pipeline["split_points"] == [3, 5, 8]
    first, second = pipeline["stages"]
    assert [(c["stage_index"], c["layers"]) for c in first["chunks"]] == [(0, [0, 3]),
                                                                          (2, [5, 8])]
    assert [(c["stage_index"], c["layers"]) for c in second["chunks"]] == [(1, [3, 5]),
                                                                           (3, [8, 10])]
    assert second["chunks"][1]["module_names"][-2:] == ["norm", "lm_head"]
    assert "layers" not in first and first["recompute"] is True
    assert any("torch.utils.checkpoint" in note for note in got["notes"])


def test_interleaved_plan_of_one_chunk_per_stage_runs_plain_1f1b_everywhere() -> None:
    plan = _plan((1, 4, [(1, ["a:0"], 0, 5), (1, ["a:1"], 5, 10)]), schedule="interleaved-1f1b")
    assert export_plan(plan, "pipelining")["pipelines"][0]["schedule_class"] == "Schedule1F1B"
    assert expressible(plan, "deepspeed") is None
    assert "--num-virtual-stages-per-pipeline-rank" not in export_plan(plan, "megatron")["args"]
    assert export_plan(plan, "torchtitan")["config"]["parallelism"][
        "pipeline_parallel_schedule"] == "1F1B"


def test_pipelining_says_when_torch_runs_another_interleaved_order() -> None:
    # 6 micro-batches on 4 stages: torch accepts (1 round), the cost model's rule does not.
    plan = parse_plan({"schedule": "interleaved-1f1b", "pipelines": [
        {"micro_batch_size": 1, "num_micro_batches": 6, "stages": [
            {"gpu_type": "g", "tp": 1, "gpus": [f"a:{s}"], "chunks": [[s, s + 1], [s + 4, s + 5]]}
            for s in range(4)]}]})
    notes = export_plan(plan, "pipelining")["notes"]
    assert any("not the one the plan was estimated on" in note for note in notes)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_expressible_answers_for_chunked_and_recomputing_plans(fmt: str) -> None:
    # A launcher-restricted search asks this of every schedule variant: it must answer
    # (None or reasons), never fail on a plan of several chunks per stage.
    for plan in (_chunked(), _chunked(recompute=True), _chunked(num_micro_batches=3)):
        answer = expressible(plan, fmt)
        assert answer is None or answer.strip()
