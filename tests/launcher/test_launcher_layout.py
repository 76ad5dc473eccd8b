"""Which layers each launched process holds and with whom it sums gradients, for plans with
chunks (interleaved-1f1b) and local blocks; what the launcher refuses to run. No processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.layout import launch_problems, launch_rank_map, stage_of_layers, sync_groups
from planner import parse_plan
from planner.documents import Schedule
from planner.export.ranks import build_rank_map

DATA = Path(__file__).parent / "data"

# Pipeline 0: two stages of two one-layer chunks each (stage 1 TP=2, GPUs out of index order);
# pipeline 1: the whole model on one GPU.
CHUNKED = {
    "format": "hetplan-plan/1", "schedule": "interleaved-1f1b",
    "pipelines": [
        {"micro_batch_size": 1, "num_micro_batches": 4, "stages": [
            {"gpu_type": "cpu", "tp": 1, "gpus": ["n0:0"], "chunks": [[0, 1], [2, 3]]},
            {"gpu_type": "cpu", "tp": 2, "gpus": ["n0:2", "n0:1"], "chunks": [[1, 2], [3, 4]]}]},
        {"micro_batch_size": 2, "num_micro_batches": 2, "stages": [
            {"gpu_type": "cpu", "tp": 1, "gpus": ["n1:0"], "layers": [0, 4]}]},
    ],
}


def two_stages(first: list[list[int]], second: list[list[int]], *, m: int = 4,
               schedule: str = "interleaved-1f1b") -> dict:
    return {"format": "hetplan-plan/1", "schedule": schedule, "pipelines": [
        {"micro_batch_size": 1, "num_micro_batches": m, "stages": [
            {"gpu_type": "cpu", "tp": 1, "gpus": ["n0:0"], "chunks": first},
            {"gpu_type": "cpu", "tp": 1, "gpus": ["n0:1"], "chunks": second}]}]}


def test_each_layer_is_held_by_the_stage_of_its_model_chunk() -> None:
    plan = parse_plan(CHUNKED)
    assert stage_of_layers(plan.pipelines[0]) == [0, 1, 0, 1]
    assert stage_of_layers(plan.pipelines[1]) == [0, 0, 0, 0]


def test_chunked_plan_syncs_each_chunk_with_the_stage_holding_it_elsewhere() -> None:
    ranks = launch_rank_map(parse_plan(CHUNKED))
    # Ranks: n0:0 -> 0, n0:1 -> 1, n0:2 -> 2 (TP rank 0 of stage 1), n1:0 -> 3.
    assert [(g.layers, g.kind, g.rank_groups) for g in ranks.sync_groups] == [
        ((0, 1), "sharded", ((0, 3),)),
        ((1, 2), "resharded", ((2, 1, 3),)),
        ((2, 3), "sharded", ((0, 3),)),
        ((3, 4), "resharded", ((2, 1, 3),)),
    ]
    assert ranks.world_size == 4 and ranks.num_layers == 4
    assert ranks.stage_ranks(0, 1) == (2, 1)
    assert [r.chunks for r in ranks.ranks] == [((0, 1), (2, 3)), ((1, 2), (3, 4)),
                                               ((1, 2), (3, 4)), ((0, 4),)]


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("*.plan.json")))
def test_sync_groups_equal_the_rank_maps_on_every_test_plan(name: str) -> None:
    plan = parse_plan(json.loads((DATA / name).read_text()))
    ranks = build_rank_map(plan)
    assert sync_groups(plan, ranks) == ranks.sync_groups
    assert launch_rank_map(plan) == ranks


def test_chunks_under_another_schedule_are_refused() -> None:
    plan = parse_plan(two_stages([[0, 1], [2, 3]], [[1, 2], [3, 4]], schedule="1f1b"))
    (problem,) = launch_problems(plan, Schedule.ONE_F_ONE_B, 4)
    assert "hold 2 chunks but the schedule is '1f1b'" in problem


def test_chunks_under_local_are_refused_as_chunks() -> None:
    plan = parse_plan(two_stages([[0, 1], [2, 3]], [[1, 2], [3, 4]], schedule="local"))
    (problem,) = launch_problems(plan, Schedule.LOCAL, 4)
    assert "hold 2 chunks but the schedule is 'local'" in problem


def test_interleaving_needs_micro_batches_in_multiples_of_the_stages() -> None:
    plan = parse_plan(two_stages([[0, 1], [2, 3]], [[1, 2], [3, 4]], m=3))
    (problem,) = launch_problems(plan, Schedule.INTERLEAVED_1F1B, 4)
    assert "num_micro_batches is 3, not a multiple of its 2 stages" in problem


def test_chunks_that_skip_layers_are_refused() -> None:
    plan = parse_plan(two_stages([[0, 1], [3, 4]], [[1, 2], [2, 3]]))
    problems = launch_problems(plan, Schedule.INTERLEAVED_1F1B, 4)
    assert any("does not continue the model at layer 2" in p for p in problems)


def test_local_pipelines_with_other_blocks_are_refused() -> None:
    plan = parse_plan({"format": "hetplan-plan/1", "schedule": "local", "pipelines": [
        {"micro_batch_size": 1, "num_micro_batches": 2, "stages": [
            {"gpu_type": "cpu", "tp": 1, "gpus": ["n0:0"], "layers": [0, 2]},
            {"gpu_type": "cpu", "tp": 1, "gpus": ["n0:1"], "layers": [2, 4]}]},
        {"micro_batch_size": 1, "num_micro_batches": 2, "stages": [
            {"gpu_type": "cpu", "tp": 1, "gpus": ["n1:0"], "layers": [0, 3]},
            {"gpu_type": "cpu", "tp": 1, "gpus": ["n1:1"], "layers": [3, 4]}]}]})
    (problem,) = launch_problems(plan, Schedule.LOCAL, 4)
    assert problem.startswith("pipelines[1]: blocks [(0, 3), (3, 4)] differ from pipelines[0]'s")
    assert launch_problems(plan, Schedule.ONE_F_ONE_B, 4) == []  # end to end, any split runs
