"""Rank-map invariants on generated plans, and hand-checked cases."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner import InvalidPlan, parse_plan
from planner.export import build_rank_map, rank_map

DATA = Path(__file__).parent / "data"


@st.composite
def plans(draw: st.DrawFn) -> dict[str, Any]:
    """Valid-shaped plans: 1-3 pipelines of 1-4 stages over 2-9 layers, TP 1/2/4, GPUs drawn
    from a shuffled pool of nodes so that nodes are shared across stages and pipelines."""
    num_layers = draw(st.integers(2, 9))
    num_pipelines = draw(st.integers(1, 3))
    node_sizes = draw(st.lists(st.sampled_from([4, 8]), min_size=1, max_size=6))
    pool = [f"n{n}:{i}" for n, size in enumerate(node_sizes) for i in range(size)]
    pool = draw(st.permutations(pool))
    pipelines = []
    for _ in range(num_pipelines):
        num_stages = draw(st.integers(1, min(4, num_layers)))
        cuts = sorted(draw(st.lists(st.integers(1, num_layers - 1), min_size=num_stages - 1,
                                    max_size=num_stages - 1, unique=True)))
        bounds = [0, *cuts, num_layers]
        stages = []
        for start, end in zip(bounds, bounds[1:], strict=False):
            # A stage's GPUs share a node in real plans; the rank map must not rely on it.
            tp = draw(st.sampled_from([1, 2, 4]))
            if len(pool) < tp:
                tp = 1
            if not pool:
                pool = [f"x{len(pipelines)}-{start}:0"]
            gpus, pool = pool[:tp], pool[tp:]
            stages.append({"gpu_type": "g", "tp": tp, "gpus": gpus, "layers": [start, end]})
        pipelines.append({"micro_batch_size": draw(st.integers(1, 4)),
                          "num_micro_batches": draw(st.integers(1, 8)), "stages": stages})
    return {"format": "hetplan-plan/1", "pipelines": pipelines}


@settings(max_examples=150, deadline=None)
@given(plans())
def test_rank_map_invariants_hold_on_generated_plans(document: dict[str, Any]) -> None:
    plan = parse_plan(document)
    ranks = build_rank_map(plan)
    all_gpus = [g for p in plan.pipelines for s in p.stages for g in s.gpus]

    # Every GPU gets exactly one rank, and ranks are 0..N-1.
    assert sorted(r.gpu for r in ranks.ranks) == sorted(all_gpus)
    assert [r.rank for r in ranks.ranks] == list(range(len(all_gpus)))

    # Each node holds one contiguous block of ranks, local ranks in device-index order.
    for node in ranks.nodes:
        held = [r for r in ranks.ranks if r.node == node.name]
        assert [r.rank for r in held] == list(range(node.first_rank,
                                                    node.first_rank + node.num_processes))
        assert [r.local_rank for r in held] == list(range(node.num_processes))
        assert [r.device_index for r in held] == sorted(r.device_index for r in held)

    # TP groups are exactly the stages, ranks in the stage's GPU order.
    assert len(ranks.tp_groups) == sum(len(p.stages) for p in plan.pipelines)
    for group in ranks.tp_groups:
        stage = plan.pipelines[group.pipeline].stages[group.stage]
        assert [ranks.ranks[r].gpu for r in group.ranks] == list(stage.gpus)
        assert [ranks.ranks[r].tp_rank for r in group.ranks] == list(range(stage.tp))

    # Links join the first GPUs of neighbouring stages.
    for link in ranks.stage_links:
        stages = plan.pipelines[link.pipeline].stages
        assert ranks.ranks[link.src_rank].gpu == stages[link.from_stage].gpus[0]
        assert ranks.ranks[link.dst_rank].gpu == stages[link.to_stage].gpus[0]
        assert link.to_stage == link.from_stage + 1
    assert len(ranks.stage_links) == sum(len(p.stages) - 1 for p in plan.pipelines)

    _check_sync_groups(plan, ranks)

    shares = ranks.pipelines
    assert sum(s.batch_share for s in shares) == pytest.approx(1.0)
    assert [s.first_sample for s in shares] == [sum(x.num_samples for x in shares[:i])
                                                for i in range(len(shares))]
    json.dumps(rank_map(plan))  # JSON-ready


def _check_sync_groups(plan: Any, ranks: Any) -> None:
    # Each layer lies in exactly one sync group, which names one holder per pipeline.
    for layer in range(ranks.num_layers):
        covering = [g for g in ranks.sync_groups if g.layers[0] <= layer < g.layers[1]]
        assert len(covering) == 1
        holders = covering[0].holders
        assert [h.pipeline for h in holders] == list(range(len(plan.pipelines)))
        for h in holders:
            stage = plan.pipelines[h.pipeline].stages[h.stage]
            assert stage.layers[0] <= layer < stage.layers[1]
    # Groups are maximal: neighbours differ in their holders.
    for left, right in zip(ranks.sync_groups, ranks.sync_groups[1:], strict=False):
        assert left.layers[1] == right.layers[0]
        assert left.holders != right.holders
    for group in ranks.sync_groups:
        stage_ranks = [ranks.stage_ranks(h.pipeline, h.stage) for h in group.holders]
        if group.kind == "sharded":
            # TP rank k of every holder, for each k.
            assert len({h.tp_size for h in group.holders}) == 1
            assert [list(g) for g in group.rank_groups] == [list(g) for g in zip(*stage_ranks,
                                                                                 strict=True)]
        else:
            assert len({h.tp_size for h in group.holders}) > 1
            assert sorted(group.rank_groups[0]) == sorted(r for rs in stage_ranks for r in rs)


def test_asymmetric_pipelines_get_one_sync_group_per_distinct_holder_set() -> None:
    plan = parse_plan({"pipelines": [
        {"micro_batch_size": 2, "num_micro_batches": 3, "stages": [
            {"gpu_type": "g", "tp": 2, "gpus": ["a:0", "a:1"], "layers": [0, 2]},
            {"gpu_type": "g", "tp": 1, "gpus": ["a:2"], "layers": [2, 4]}]},
        {"micro_batch_size": 1, "num_micro_batches": 2, "stages": [
            {"gpu_type": "g", "tp": 1, "gpus": ["b:0"], "layers": [0, 4]}]},
    ]})
    got = rank_map(plan)
    assert got["sync_groups"] == [
        {"layers": [0, 2], "kind": "resharded",
         "holders": [{"pipeline": 0, "stage": 0, "tp_size": 2},
                     {"pipeline": 1, "stage": 0, "tp_size": 1}],
         "rank_groups": [[0, 1, 3]]},
        {"layers": [2, 4], "kind": "sharded",
         "holders": [{"pipeline": 0, "stage": 1, "tp_size": 1},
                     {"pipeline": 1, "stage": 0, "tp_size": 1}],
         "rank_groups": [[2, 3]]},
    ]
    assert got["pipelines"][0]["batch_share"] == 0.75
    assert got["pipelines"][1]["first_sample"] == 6


def test_local_ranks_follow_device_index_not_plan_order() -> None:
    plan = parse_plan({"pipelines": [{"micro_batch_size": 1, "num_micro_batches": 1, "stages": [
        {"gpu_type": "g", "tp": 1, "gpus": ["a:5"], "layers": [0, 1]},
        {"gpu_type": "g", "tp": 1, "gpus": ["b:0"], "layers": [1, 2]},
        {"gpu_type": "g", "tp": 1, "gpus": ["a:2"], "layers": [2, 3]}]}]})
    got = rank_map(plan)
    assert [(r["gpu"], r["rank"], r["local_rank"]) for r in got["ranks"]] == [
        ("a:2", 0, 0), ("a:5", 1, 1), ("b:0", 2, 0)]
    assert got["nodes"][0]["device_indices"] == [2, 5]


def test_plan_with_a_gpu_used_twice_is_rejected() -> None:
    plan = parse_plan({"pipelines": [
        {"micro_batch_size": 1, "num_micro_batches": 1, "stages": [
            {"gpu_type": "g", "tp": 1, "gpus": ["a:0"], "layers": [0, 2]}]},
        {"micro_batch_size": 1, "num_micro_batches": 1, "stages": [
            {"gpu_type": "g", "tp": 1, "gpus": ["a:0"], "layers": [0, 2]}]}]})
    with pytest.raises(InvalidPlan, match="GPU used twice"):
        rank_map(plan)


def test_plan_with_a_gap_between_stages_is_rejected() -> None:
    plan = parse_plan({"pipelines": [{"micro_batch_size": 1, "num_micro_batches": 1, "stages": [
        {"gpu_type": "g", "tp": 1, "gpus": ["a:0"], "layers": [0, 2]},
        {"gpu_type": "g", "tp": 1, "gpus": ["a:1"], "layers": [3, 4]}]}]})
    with pytest.raises(InvalidPlan, match="contiguously"):
        rank_map(plan)


def test_plan_with_tp_not_matching_its_gpus_is_rejected() -> None:
    plan = parse_plan({"pipelines": [{"micro_batch_size": 1, "num_micro_batches": 1, "stages": [
        {"gpu_type": "g", "tp": 2, "gpus": ["a:0"], "layers": [0, 2]}]}]})
    with pytest.raises(InvalidPlan, match="list exactly tp GPUs"):
        rank_map(plan)


@pytest.mark.parametrize("path", sorted(DATA.glob("*.plan.json")), ids=lambda p: p.name)
def test_reference_plans_map_every_gpu_once(path: Path) -> None:
    plan = parse_plan(json.loads(path.read_text()))
    got = rank_map(plan)
    gpus = [g for p in plan.pipelines for s in p.stages for g in s.gpus]
    assert got["world_size"] == len(gpus) == len({r["gpu"] for r in got["ranks"]})
