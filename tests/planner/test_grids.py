"""Grids: identical pipelines over several GPU classes, each class split evenly."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner import SearchOptions, evaluate, parse_plan, parse_scenario, plan
from planner.costs import state_bytes_per_param
from planner.search import drafts, grids
from planner.search.quick import replicas_sync_s
from planner.search.tables import compile_tables
from planner.search.templates import PipelineTemplate, StageShape, TemplateContext
from tests.planner.scenarios import tiny, with_wan

SCENARIOS = Path(__file__).resolve().parent.parent / "data" / "scenarios"

LAYER_STATE_GIB = 100_000_000 * 18 / 2**30  # one layer's weights, grads and Adam state


def memory_bound(layers_per_type: dict[str, int], gpus: int = 8, batch: int = 64,
                 forward_ms: dict[str, float] | None = None) -> dict[str, Any]:
    """Types with room for their count of the twelve layers each (and not one more),
    `gpus` of each on one node."""
    doc = tiny()
    doc["model"]["layers"] = ["b"] * 12
    doc["model"]["kinds"] = {"b": {"params": 100_000_000, "output_bytes_per_sample": 1_000_000}}
    doc["gpu_types"] = {t: {"memory_gib": 2.0 + (n + 0.5) * LAYER_STATE_GIB}
                        for t, n in layers_per_type.items()}
    doc["cluster"]["nodes"] = [{"name": t.lower(), "gpu_type": t, "gpus": gpus}
                               for t in layers_per_type]
    doc["cluster"]["intra_node"] = {t: {"bandwidth_gb_per_s": 100, "latency_us": 0}
                                    for t in layers_per_type}
    speed = forward_ms or {}
    doc["profiles"] = [{"gpu_type": t, "kind": "b", "micro_batch": 1, "tp": 1,
                        "forward_ms": speed.get(t, 1.0), "backward_ms": 2 * speed.get(t, 1.0),
                        "activation_bytes": 1_000_000}
                       for t in layers_per_type]
    doc["job"] = {"global_batch_size": batch, "reserved_gib": 2.0}
    return doc


def one_pipeline(split: dict[str, list[tuple[int, int]]], m: int, replica: int = 0) -> dict[str, Any]:
    return {"micro_batch_size": 1, "num_micro_batches": m, "stages": [
        {"gpu_type": t, "tp": 1, "gpus": [f"{t.lower()}:{replica * len(ranges) + i}"],
         "layers": list(layers)}
        for t, ranges in split.items() for i, layers in enumerate(ranges)]}


def test_a_pipeline_through_three_types_split_by_speed_is_found_without_enumeration() -> None:
    # Two GPUs of each type, each with room for five of the twelve layers: no type, and no
    # two types, hold the model. X is three times as fast as Z: an even split (the unaware
    # baseline's) waits on Z.
    doc = memory_bound({"X": 5, "Y": 5, "Z": 5}, gpus=2,
                       forward_ms={"X": 1.0, "Y": 2.0, "Z": 3.0})
    scenario = parse_scenario(doc)
    # By hand: one pipeline of six stages, X's holding four and three layers, Y's two and
    # one, Z's one each (12, 9, 12, 6, 9 and 9 ms a micro-batch); or two replicas of X, Y,
    # Z holding five, four and three layers (15, 24 and 27 ms).
    by_hand = [
        {"format": "hetplan-plan/1", "pipelines": [one_pipeline(
            {"X": [(0, 4), (4, 7)], "Y": [(7, 9), (9, 10)], "Z": [(10, 11), (11, 12)]}, 64)]},
        {"format": "hetplan-plan/1", "pipelines": [one_pipeline(
            {"X": [(0, 5)], "Y": [(5, 9)], "Z": [(9, 12)]}, 32, replica=r) for r in range(2)]},
    ]
    times = []
    for doc_plan in by_hand:
        judged = evaluate(scenario, parse_plan(doc_plan))
        assert judged.valid and judged.iteration_s is not None, judged.errors
        times.append(judged.iteration_s)
    result = plan(scenario, SearchOptions(time_limit_s=10, enumerate_small=False))
    assert result.evaluation.iteration_s is not None
    # The search's split may fill a little differently from these: within 1%.
    assert result.evaluation.iteration_s <= min(times) * 1.01
    assert result.baselines["per_type"] is None
    unaware = result.baselines["unaware"]
    rate = result.evaluation.samples_per_s
    assert unaware is not None and rate is not None and rate > unaware * 1.2
    assert all({s.gpu_type for s in p.stages} == {"X", "Y", "Z"} for p in result.plan.pipelines)


@pytest.mark.parametrize("batch", [64, 63])
def test_grid_candidates_are_valid_plans_of_identical_replicas(batch: int) -> None:
    """Replicas share their stages and micro-batch size; where their count does not divide
    the batch (63 samples; or counts that leave GPUs idle, such as 3 replicas of these
    classes' 8 GPUs), their micro-batch counts differ by one at most."""
    scenario = parse_scenario(memory_bound({"X": 6, "Y": 4, "Z": 2}, batch=batch))
    families = grids.grid_candidates(compile_tables(scenario))
    assert families.even and families.with_idle
    for candidate in [*families.even, *families.with_idle]:
        pipelines = candidate.plan.pipelines
        shapes = {(p.micro_batch_size, tuple((s.gpu_type, s.tp, tuple(s.layers))
                                             for s in p.stages)) for p in pipelines}
        assert len(shapes) == 1, "replicas differ"
        counts = [p.num_micro_batches for p in pipelines]
        assert max(counts) - min(counts) <= 1
        assert sum(p.micro_batch_size * p.num_micro_batches for p in pipelines) == batch
        assert evaluate(scenario, candidate.plan).valid
    uneven = [c for c in families.even
              if len({p.num_micro_batches for p in c.plan.pipelines}) > 1]
    assert uneven if batch % 2 else not uneven


@settings(max_examples=25, deadline=None)
@given(counts=st.tuples(*[st.integers(1, 6)] * 3), gpus=st.sampled_from([4, 6, 8, 12]),
       batch=st.sampled_from([24, 45, 48, 64, 96]), idle=st.booleans())
def test_grids_are_the_structures_that_split_every_class_evenly_or_leave_some_idle(
        counts: tuple[int, int, int], gpus: int, batch: int, idle: bool) -> None:
    doc = memory_bound(dict(zip("XYZ", counts, strict=True)), gpus=gpus, batch=batch)
    tables = compile_tables(parse_scenario(doc))
    ctx = TemplateContext(tables, tables.scenario.job.schedule)
    best_tp = {(c.key, 1): [1] for c in tables.classes}
    for subset in grids._subsets(tables):
        per_param = np.array([state_bytes_per_param(tables.scenario, n).total
                              for n in range(1, gpus + 1)])
        found = list(grids._least(ctx, subset, best_tp, per_param, idle=idle))
        shapes = {(g.replicas, g.stages) for g in found}
        assert len(shapes) == len(found)
        # Every count n that splits each class's GPUs (with `idle`: every count that does
        # not, each replica a stage of each class at least), with a micro-batch for each
        # replica and at most a stage per layer; those whose average stage (12 / depth
        # layers, the types being equally fast) fits on every type of the subset are all
        # there.
        possible = {(n, (gpus // n,) * len(subset)) for n in range(1, gpus + 1)
                    if (gpus % n != 0) == idle and n <= batch and len(subset) * (gpus // n) <= 12}
        assert shapes <= possible
        room = min(counts["XYZ".index(c.gpu_type)] for c in subset)
        assert {(n, s) for n, s in possible if 12 / sum(s) <= room} <= shapes
        for grid in found:
            for cls, tp, stages in zip(grid.classes, grid.tp, grid.stages, strict=True):
                used = grid.replicas * stages * tp
                assert used == cls.num_gpus if not idle else cls.num_gpus - grid.replicas < used
    assert len(grids._subsets(tables)) == 4  # all three types, and each pair


@settings(max_examples=60, deadline=None)
@given(stages=st.lists(st.lists(st.integers(1, 5), min_size=3, max_size=3), min_size=1,
                       max_size=4),
       layer_ms=st.lists(st.sampled_from([1.0, 1.5, 2.0, 3.0, 7.0]), min_size=3, max_size=3),
       extra_layers=st.integers(0, 20), room=st.integers(1, 40),
       start_ms=st.sampled_from([0.0, 0.5, 4.0]), ends_hold=st.booleans())
def test_the_whole_layer_bottleneck_is_the_least_stage_time_that_covers_the_model(
        stages: list[list[int]], layer_ms: list[float], extra_layers: int, room: int,
        start_ms: float, ends_hold: bool) -> None:
    counts = np.array(stages)
    needed = int(counts.sum(axis=1).max()) + extra_layers
    # Per pipeline, its stages class after class, padded with stages that hold nothing.
    deepest = int(counts.sum(axis=1).max())
    layer_s = np.full((len(stages), deepest), np.inf)
    start, most, least = (np.zeros((len(stages), deepest)) for _ in range(3))
    for row, per_class in enumerate(stages):
        times = [ms / 1000 for ms, n in zip(layer_ms, per_class, strict=True) for _ in range(n)]
        depth = len(times)
        layer_s[row, :depth] = times
        # The k-th stage from the front has room for `room` - k layers (memory in flight);
        # stages in the middle are busy twice as long before their layers as the two at the
        # ends, which (unless `ends_hold`) need hold none.
        most[row, :depth] = [room - k for k in range(depth)]
        start[row, :depth] = [start_ms / 1000 * (2 if 0 < k < depth - 1 else 1)
                              for k in range(depth)]
        least[row, :depth] = [1 if ends_hold or 0 < k < depth - 1 else 0 for k in range(depth)]
    found = grids._whole_layers_bottleneck(layer_s, start, most, least, needed)
    for row, fastest in zip(range(len(stages)), found, strict=True):
        # By brute force: a stage time is its start and a whole number of its layers; the
        # least such time long enough for every stage's least at which together they hold
        # what is needed, none more than its room; none where no time does.
        real = np.isfinite(layer_s[row])
        held = list(zip(layer_s[row][real], start[row][real], most[row][real],
                        least[row][real], strict=True))
        times = sorted({j * s + p for s, p, _, _ in held for j in range(0, needed + 1)})
        expected = next((t for t in times if all(t >= p + n * s - 1e-15 for s, p, _, n in held)
                         and sum(min(math.floor((t - p) / s + 1e-9), m) for s, p, m, _ in held)
                         >= needed), math.inf)
        assert fastest == pytest.approx(expected, rel=1e-9)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), rows=st.integers(1, 400))
def test_structures_come_in_order_of_their_whole_layer_estimate(seed: int, rows: int) -> None:
    # The lazy order (corrections computed in batches, in order of the balanced estimate,
    # which bounds them from below) is the full sort by the corrected estimate, without the
    # structures that cannot hold the model.
    rng = np.random.default_rng(seed)
    stages = rng.integers(1, 5, size=(rows, 3))
    layer_s = rng.uniform(0.001, 0.01, size=(rows, 3))
    step_s = 1.0 / (stages / (layer_s * 40)).sum(axis=1)
    steady = rng.integers(0, 64, size=rows)
    estimates = grids._Estimates(
        micro_batch=np.ones(rows, dtype=int), tps=np.ones((rows, 3), dtype=int),
        counts=np.ones(rows, dtype=int), stages=stages, step_s=step_s, steady=steady,
        balanced_s=(steady + stages.sum(axis=1)) * step_s
        + rng.uniform(0, 0.5, size=rows))
    # Any heaviest stage will do (one below the balanced step corrects nothing); some rows
    # ruled out; a first estimate of it below the second, which counts.
    heaviest = np.where(rng.uniform(size=rows) < 0.1, np.inf,
                        step_s * rng.uniform(0.8, 3.0, size=rows))
    first = np.where(np.isfinite(heaviest), heaviest * rng.uniform(0.5, 1.0, size=rows), 0.0)
    possible = np.isfinite(heaviest)
    corrected = estimates.balanced_s + steady * np.maximum(
        0, np.where(possible, heaviest, 0) - step_s)
    expected = [r for r in np.argsort(corrected, kind="stable").tolist() if possible[r]]
    given = list(grids._by_whole_layers(estimates, [first.__getitem__, heaviest.__getitem__]))
    found = [r for _, r in given]
    # Ties may come in another order: compare the estimates.
    assert [corrected[r] for r in found] == [corrected[r] for r in expected]
    assert [key for key, _ in given] == pytest.approx([corrected[r] for r in found])
    assert sorted(found) == sorted(expected)


def test_structures_that_do_not_fit_do_not_count_among_the_first_swept() -> None:
    # Twelve layers, room for two on each GPU: 12 X and 12 Y GPUs in 6 or 12 replicas (4 or
    # 2 stages each) cannot hold the model, nor 1 replica (24 stages for 12 layers); 4, 3
    # and 2 replicas can. Ranked first, the two that cannot must not use up the three
    # structures swept whatever the budget; a third that cannot ends the free ones.
    doc = memory_bound({"X": 2, "Y": 2}, gpus=12, batch=12)
    tables = compile_tables(parse_scenario(doc))
    ctx = TemplateContext(tables, tables.scenario.job.schedule)
    ranked = [grids._Grid(classes=tables.classes, micro_batch=1, tp=(1, 1), replicas=n,
                          stages=(12 // n, 12 // n)) for n in (12, 6, 4, 3, 2, 1)]
    swept = list(grids._swept_within(ctx, iter(ranked), budget=0))
    assert {grid.replicas for grid, _ in swept} == {4, 3, 2}
    fewer = list(grids._swept_within(ctx, iter([ranked[0], ranked[1], ranked[5], *ranked[2:5]]),
                                     budget=0))
    assert {grid.replicas for grid, _ in fewer} == set()


def test_structures_past_the_first_three_are_swept_within_the_budget() -> None:
    # The fleet above: 4, 3 and 2 replicas fit. Past the three swept whatever the budget, a
    # structure costs layers x stages x orders of cells: 12 x 6 x 2 = 144 for 4 replicas,
    # then 12 x 8 x 2 more for 3. A budget of 150 cells takes the first and stops at the
    # second.
    doc = memory_bound({"X": 2, "Y": 2}, gpus=12, batch=12)
    tables = compile_tables(parse_scenario(doc))
    ctx = TemplateContext(tables, tables.scenario.job.schedule)
    grid = {n: grids._Grid(classes=tables.classes, micro_batch=1, tp=(1, 1), replicas=n,
                           stages=(12 // n, 12 // n)) for n in (4, 3, 2)}
    order = [grid[4], grid[3], grid[2], grid[4], grid[3]]
    swept = [g.replicas for g, _ in grids._swept_within(ctx, iter(order), budget=150)]
    beyond = len(list(grids._swept(ctx, grid[4])))
    assert beyond and swept[-beyond:] == [4] * beyond
    assert set(swept[:-beyond]) == {4, 3, 2}
    assert len(swept) == len([t for g in order[:4] for t in grids._swept(ctx, g)])


def test_tps_whose_homogeneous_pipelines_do_not_fit_still_come_after_those_that_do() -> None:
    # X and Y profiled at tp 1, 2 and 4, tp 1 the least compute per sample, then 2, then 4.
    # X's homogeneous pipelines fit at tp 2 only (as T4s of a GPT-2.7B input do at
    # micro-batch 2: sixteen of them, each holding a few of a deep pipeline's in-flight
    # activations at tp 4 only); in a grid a class holds a few layers and may run at the
    # others. Y has no homogeneous pipeline at all: ranked by compute alone.
    doc = memory_bound({"X": 6, "Y": 4}, gpus=4)
    doc["profiles"] += [dict(row, tp=tp, forward_ms=row["forward_ms"] * factor,
                             backward_ms=row["backward_ms"] * factor)
                        for row in list(doc["profiles"]) for tp, factor in ((2, 0.6), (4, 0.35))]
    tables = compile_tables(parse_scenario(doc))
    x, y = (next(c for c in tables.classes if c.gpu_type == t) for t in "XY")
    only_tp2 = SimpleNamespace(stages=(StageShape(resource=x.key, tp=2),) * 2, micro_batch=1,
                               bottleneck_s=0.01, num_gpus=4)
    best = grids._best_tp(tables, [cast(PipelineTemplate, only_tp2)])
    assert best[(x.key, 1)] == [2, 1, 4][:grids.TP_PER_CLASS]
    assert best[(y.key, 1)] == [1, 2, 4][:grids.TP_PER_CLASS]


def with_activations(doc: dict[str, Any], layer_states: float) -> dict[str, Any]:
    """Every layer's activations per micro-batch: `layer_states` times its state."""
    for row in doc["profiles"]:
        row["activation_bytes"] = int(layer_states * LAYER_STATE_GIB * 2**30)
    return doc


def structures(ctx: TemplateContext, subset: Any, best_tp: Any, per_param: np.ndarray,
               monkeypatch: pytest.MonkeyPatch, *, ruled_out: bool) -> list[Any]:
    """The subset's grids, with the memory rule or without it (every stage with room for
    the whole model)."""
    with monkeypatch.context() as patched:
        if not ruled_out:
            room = np.full(ctx.tables.max_stages + 1, float(ctx.tables.num_layers))
            patched.setattr(grids, "_stage_layers", lambda *args: (room, room, room))
        return list(grids._least(ctx, subset, best_tp, per_param))


def test_structures_whose_stages_cannot_hold_the_model_are_ruled_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Twelve layers; each GPU has room for 6.5 layers of state, and a micro-batch's
    # activations of a layer take half a layer's state. The stage k-th from the back keeps
    # k micro-batches (1F1B) and so holds at most 6.5 / (1 + k / 2) layers: 4, 3, 2, 2, 1,
    # 1, ... Eight GPUs of each of two types: 2, 4 or 8 stages a replica (8, 4 or 2
    # replicas). Two stages hold at most 4 + 3 (the first holding layer 0 beside its
    # others), four 4 + 3 + 2 + 2: fewer than twelve, ruled out; eight hold 15.
    doc = with_activations(memory_bound({"X": 6, "Y": 6}, gpus=8, batch=64), 0.5)
    tables = compile_tables(parse_scenario(doc))
    ctx = TemplateContext(tables, tables.scenario.job.schedule)
    best_tp = {(c.key, 1): [1] for c in tables.classes}
    per_param = np.array([state_bytes_per_param(tables.scenario, n).total for n in range(1, 9)])
    (subset,) = grids._subsets(tables)
    every = structures(ctx, subset, best_tp, per_param, monkeypatch, ruled_out=False)
    kept = structures(ctx, subset, best_tp, per_param, monkeypatch, ruled_out=True)
    assert {sum(g.stages) for g in every} == {2, 4, 8}
    assert {sum(g.stages) for g in kept} == {8}
    for grid in every:
        swept = list(grids._swept(ctx, grid, least_time=False))
        assert bool(swept) == (sum(grid.stages) == 8)


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # undone per example
@given(rooms=st.tuples(st.integers(1, 8), st.integers(1, 8), st.integers(1, 8)),
       activations=st.sampled_from([0.02, 0.2, 0.5, 1.0]), gpus=st.sampled_from([2, 4, 6, 8]),
       batch=st.sampled_from([4, 16, 64]))
def test_no_structure_ruled_out_by_memory_gives_a_pipeline(
        rooms: tuple[int, int, int], activations: float, gpus: int, batch: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The memory rule is a shortcut for the layer DP, never a second opinion: every
    structure it rules out, swept, gives nothing."""
    doc = with_activations(memory_bound(dict(zip("XYZ", rooms, strict=True)), gpus=gpus,
                                        batch=batch), activations)
    tables = compile_tables(parse_scenario(doc))
    ctx = TemplateContext(tables, tables.scenario.job.schedule)
    best_tp = {(c.key, 1): [1] for c in tables.classes}
    per_param = np.array([state_bytes_per_param(tables.scenario, n).total
                          for n in range(1, gpus + 1)])
    for subset in grids._subsets(tables):
        kept = {(g.replicas, g.stages) for g in structures(ctx, subset, best_tp, per_param,
                                                           monkeypatch, ruled_out=True)}
        for grid in structures(ctx, subset, best_tp, per_param, monkeypatch, ruled_out=False):
            if (grid.replicas, grid.stages) not in kept:
                assert not list(grids._swept(ctx, grid, least_time=False)), grid


def test_grids_are_ranked_by_the_stages_whole_layers_can_balance() -> None:
    # Twelve equal layers over two equally fast types, 12 GPUs of X (room for 6 layers
    # each) and 4 of Y (room for 3), batch 96. Two replicas of 6 X and 2 Y stages would
    # hold 1.5 layers a stage on average, but in whole layers four of them hold 2: 47
    # further micro-batches at 6 ms. Four replicas of 3 X and 1 Y stages hold 3 each: 23
    # at 9 ms. Balanced stages ranked the first ahead, and it is 25% slower.
    doc = memory_bound({"X": 6, "Y": 3}, batch=96)
    doc["cluster"]["nodes"] = [{"name": "x", "gpu_type": "X", "gpus": 12},
                               {"name": "y", "gpu_type": "Y", "gpus": 4}]
    tables = compile_tables(parse_scenario(doc))
    ctx = TemplateContext(tables, tables.scenario.job.schedule)
    per_param = np.array([state_bytes_per_param(tables.scenario, n).total
                          for n in range(1, 13)])
    ranked = list(grids._least(ctx, tables.classes, {(c.key, 1): [1] for c in tables.classes},
                               per_param))
    assert (ranked[0].replicas, ranked[0].stages) == (4, (3, 1))

    def swept_s(grid: grids._Grid) -> float:
        found = [drafts.replicas_draft(tables, t, grid.replicas, "grid")
                 for t in grids._swept(ctx, grid)]
        return min(d.rough_s for d in found if d is not None)

    times = {(g.replicas, g.stages): swept_s(g) for g in ranked}
    assert times[(4, (3, 1))] == min(times.values())
    assert times[(2, (6, 2))] > 1.2 * times[(4, (3, 1))]


def test_drafts_of_few_micro_batches_are_timed_by_the_simulation_and_rings_in_nodes() -> None:
    """An F stage of 11 layers in front of an S stage of one, four replicas placed
    stage-major (each stage's four copies on one 4-GPU node). With 2 micro-batches the
    light S stage's fill hides inside the F stage's work: the draft's time is the
    estimator's, below fill + (m - 1) * bottleneck; with many micro-batches that linear
    model is kept. The draft's sync is the estimator's too: every ring inside a node."""
    doc = memory_bound({"F": 12, "S": 12}, gpus=4, batch=8, forward_ms={"F": 1.0, "S": 4.0})
    doc["cluster"]["inter_node"] = {"bandwidth_gb_per_s": 1, "latency_us": 0}
    scenario = parse_scenario(doc)
    tables = compile_tables(scenario)
    ctx = TemplateContext(tables, scenario.job.schedule)
    shapes = [StageShape(resource=c.key, tp=1) for c in tables.classes]
    assert [s.gpu_type for s in shapes] == ["F", "S"]
    template = ctx.fixed(shapes, 1, [0, 11, 12])
    assert template is not None
    placed = parse_plan({"format": "hetplan-plan/1", "pipelines": [
        one_pipeline({"F": [(0, 11)], "S": [(11, 12)]}, m=2, replica=r) for r in range(4)]})
    judged = evaluate(scenario, placed)
    assert judged.valid and judged.sync_s is not None
    simulated = drafts.pipeline_s(tables, template, 2)
    assert simulated == pytest.approx(judged.pipelines[0].T_p, rel=1e-9)
    assert simulated < 0.9 * template.time_s(2)
    assert drafts.pipeline_s(tables, template, 200) == template.time_s(200)
    assert replicas_sync_s(tables, template, 4) == pytest.approx(judged.sync_s, rel=1e-9)
    assert template.sync_s(4) > 10 * judged.sync_s  # the rings between nodes it would assume


def fast_and_slow(slowdown: float, batch: int, inter_node_gb_per_s: float) -> dict[str, Any]:
    """Four fast GPUs (F) on one node and four slower ones (S) on another, eight layers
    of 200M parameters, micro-batches of 1, 2 and 4 at tp 1, 2 and 4: with 8-16 sequences,
    four replicas run 2-4 micro-batches each."""
    rows = [{"gpu_type": gpu_type, "kind": "block", "micro_batch": b, "tp": tp,
             "forward_ms": 10.0 * factor * b / tp * (1 + 0.1 * (tp - 1)),
             "backward_ms": 20.0 * factor * b / tp * (1 + 0.1 * (tp - 1)),
             "activation_bytes": 2e8 * b / tp}
            for gpu_type, factor in (("F", 1.0), ("S", slowdown))
            for b in (1, 2, 4) for tp in (1, 2, 4)]
    return {"format": "hetplan-scenario/1",
            "gpu_types": {"F": {"memory_gib": 80}, "S": {"memory_gib": 80}},
            "cluster": {"nodes": [{"name": "f0", "gpu_type": "F", "gpus": 4},
                                  {"name": "s0", "gpu_type": "S", "gpus": 4}],
                        "intra_node": {"F": {"bandwidth_gb_per_s": 300, "latency_us": 5},
                                       "S": {"bandwidth_gb_per_s": 200, "latency_us": 5}},
                        "inter_node": {"bandwidth_gb_per_s": inter_node_gb_per_s,
                                       "latency_us": 10}},
            "model": {"name": "m", "seq_len": 2048, "layers": ["block"] * 8,
                      "kinds": {"block": {"params": 200_000_000,
                                          "output_bytes_per_sample": 16_000_000}}},
            "profiles": rows,
            "job": {"global_batch_size": batch, "grad_bytes": 2, "param_bytes": 2,
                    "optimizer_bytes": 12}}


@pytest.mark.parametrize(("slowdown", "batch", "inter_node_gb_per_s"),
                         [(2.0, 8, 5.0), (2.0, 16, 5.0), (3.0, 8, 25.0), (3.0, 16, 5.0)])
def test_few_micro_batches_reach_the_proven_optimum_without_the_enumeration(
        slowdown: float, batch: int, inter_node_gb_per_s: float) -> None:
    """The optimum (exact mode's enumeration, which shares no code with the templates or the
    grids) runs four replicas of an F stage holding six or seven layers in front of an S
    stage holding the rest: unbalanced, since with 2-4 micro-batches the fill weighs as
    much as the bottleneck. The search without its enumeration reaches it within 1%."""
    scenario = parse_scenario(fast_and_slow(slowdown, batch, inter_node_gb_per_s))
    proven = plan(scenario, SearchOptions(exact=True))
    assert proven.status.value == "optimal"
    found = plan(scenario, SearchOptions(time_limit_s=10, enumerate_small=False))
    optimum = proven.evaluation.samples_per_s or 0.0
    assert (found.evaluation.samples_per_s or 0.0) >= 0.99 * optimum


def estimates_of(ctx: TemplateContext, grid: Any) -> Any:
    """`grids._Estimates` of one structure, as far as the heaviest stage reads them."""
    one = np.zeros(1)
    return grids._Estimates(
        micro_batch=np.array([grid.micro_batch]), tps=np.array([grid.tp]),
        counts=np.array([grid.replicas]), stages=np.array([grid.stages]),
        balanced_s=one, step_s=one, steady=one)


def with_end_layers(doc: dict[str, Any], embedding: tuple[float, float],
                    head: tuple[float, float]) -> dict[str, Any]:
    """The first and last of the twelve layers of kinds of their own: (time, state and
    activations) of an embedding and a head, as multiples of a block's."""
    doc["model"]["layers"] = ["e"] + ["b"] * 10 + ["h"]
    block = doc["model"]["kinds"]["b"]
    for kind, (time, size) in (("e", embedding), ("h", head)):
        doc["model"]["kinds"][kind] = dict(block, params=int(block["params"] * size))
        doc["profiles"] += [dict(row, kind=kind, forward_ms=row["forward_ms"] * time,
                                 backward_ms=row["backward_ms"] * time,
                                 activation_bytes=int(row["activation_bytes"] * size))
                            for row in doc["profiles"] if row["kind"] == "b"]
    return doc


@settings(max_examples=40, deadline=None)
@given(rooms=st.tuples(st.integers(2, 8), st.integers(2, 8), st.integers(2, 8)),
       speeds=st.tuples(st.sampled_from([1.0, 1.5, 3.0]), st.sampled_from([1.0, 2.0])),
       activations=st.sampled_from([0.05, 0.3, 1.0]), gpus=st.sampled_from([2, 4, 6]),
       bandwidth=st.sampled_from([0.2, 2.0, 100.0]), batch=st.sampled_from([4, 64]),
       embedding=st.sampled_from([(1.0, 1.0), (0.01, 1.6), (0.5, 0.3)]),
       head=st.sampled_from([(1.0, 1.0), (0.7, 0.2), (2.5, 1.2)]))
def test_the_heaviest_stage_of_a_structure_is_the_layer_dp_s_on_alike_blocks(
        rooms: tuple[int, int, int], speeds: tuple[float, float], activations: float,
        gpus: int, bandwidth: float, batch: int, embedding: tuple[float, float],
        head: tuple[float, float]) -> None:
    """On a model of alike layers between an embedding and a head of their own, the
    ranking's heaviest stage (the activations each stage keeps in flight, the links on
    both its sides, the end layers' own time and memory) is what the layer DP finds: its
    least bottleneck over the orders of the classes, and none where it finds no split.
    (Without memory and links it was below the DP by up to 60% on a memory-tight input;
    with an embedding taken for a block, above it by 26%.)"""
    doc = with_end_layers(with_activations(
        memory_bound(dict(zip("XYZ", rooms, strict=True)), gpus=gpus, batch=batch,
                     forward_ms={"X": speeds[0], "Z": speeds[1]}), activations),
        embedding, head)
    doc["cluster"]["inter_node"] = {"bandwidth_gb_per_s": bandwidth, "latency_us": 50}
    tables = compile_tables(parse_scenario(doc))
    ctx = TemplateContext(tables, tables.scenario.job.schedule)
    per_param = np.array([state_bytes_per_param(tables.scenario, n).total
                          for n in range(1, gpus + 1)])
    for subset in grids._subsets(tables):
        for replicas in (n for n in range(1, gpus + 1) if gpus % n == 0 and n <= batch):
            grid = grids._Grid(classes=subset, micro_batch=1, tp=(1,) * len(subset),
                               replicas=replicas, stages=(gpus // replicas,) * len(subset))
            if sum(grid.stages) > tables.num_layers:
                continue
            estimates = estimates_of(ctx, grid)
            rooms = grids._rooms(ctx, subset, estimates, per_param)
            estimate = grids._heaviest_stage(ctx, subset, estimates, rooms, np.array([0]))[0]
            swept = [t.bottleneck_s for t in grids._swept(ctx, grid, least_time=False)]
            assert estimate == pytest.approx(min(swept, default=math.inf), rel=1e-9), grid
            # The cheap estimate ranks by is a lower bound of it.
            bound = grids._heaviest_per_class(ctx, subset, estimates, rooms, np.array([0]))[0]
            assert bound <= estimate * (1 + 1e-12)


def test_grid_subsets_on_two_zones_take_each_zone_less_a_class_and_each_type_alone() -> None:
    """Four types: zone a holds one node of each, zone b a V100 and a T4 node. Beside all
    classes less one class or one type, grids take each type's classes alone and each
    zone's classes reduced as the whole fleet's are (zone a less each class: a held-out
    input's best plan left zone b idle and zone a's T4s too)."""
    doc = json.loads((SCENARIOS / "l40sx16-a40x8-v32x16-t4x8-gpt2.7b.json").read_text())
    for node in doc["cluster"]["nodes"]:
        node["zone"] = "b" if node["name"] in {"v32-1", "t4-1", "l40s-1"} else "a"
    doc["cluster"]["nodes"] = [n for n in doc["cluster"]["nodes"] if n["name"] != "l40s-1"]
    with_wan(doc)
    tables = compile_tables(parse_scenario(doc))
    got = {frozenset(f"{c.gpu_type[:3]}{c.zone}" for c in subset)
           for subset in grids._subsets(tables)}
    every = frozenset({"L40a", "A10a", "V10a", "T4-a", "V10b", "T4-b"})
    zone_a = frozenset({"L40a", "A10a", "V10a", "T4-a"})
    expected = ({every} | {every - {c} for c in every}
                | {every - {c for c in every if c.startswith(t)} for t in ("V10", "T4-")}
                | {frozenset({c for c in every if c.startswith(t)}) for t in ("V10", "T4-")}
                | {frozenset({"L40a"}), frozenset({"A10a"})}
                | {zone_a} | {zone_a - {c} for c in zone_a}
                | {frozenset({"V10b", "T4-b"})})
    assert got == expected


def test_rooms_of_many_state_shares_at_once_are_those_of_each_alone() -> None:
    """Under ZeRO every replica count has its own state share: the rooms of all of them are
    computed together, and each must be what it is computed alone (rows not mixed)."""
    doc = json.loads((SCENARIOS / "h200x8-h100x16-a80x16-llama13b.json").read_text())
    doc["job"]["zero_stage"] = 1
    scenario = parse_scenario(doc)
    shares = sorted({state_bytes_per_param(scenario, n).total for n in range(1, 40)})
    assert len(shares) > 10
    together = compile_tables(scenario)
    ctx = TemplateContext(together, scenario.job.schedule)
    for cls in together.classes:
        gpu_type, b, tp = next(key for key in together.points if key[0] == cls.gpu_type)
        grids._stage_layers_by_share(ctx, cls, b, tp, shares[::2] + shares[1::2])
        for share in shares:
            alone = compile_tables(scenario)
            one = grids._stage_layers(TemplateContext(alone, scenario.job.schedule),
                                      next(c for c in alone.classes if c.key == cls.key),
                                      b, tp, share)
            for got, want in zip(grids._stage_layers(ctx, cls, b, tp, share), one, strict=True):
                assert np.array_equal(got, want)
