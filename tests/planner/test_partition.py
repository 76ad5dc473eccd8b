"""The layer-partition DP is exact: it equals brute force over every contiguous split."""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner import parse_scenario
from planner.documents import Scenario, Schedule
from planner.search import partition
from planner.search.partition import (
    LinkCost,
    Partition,
    StageSpec,
    SuffixSweep,
    extract_light_together,
    fixed_partition,
    sweep_together,
)
from planner.search.tables import ScenarioTables, compile_tables
from planner.search.templates import StageShape, TemplateContext
from tests.planner.scenarios import tiny


def scenario_with(times: list[float], memory_gib: float) -> dict:
    doc = tiny()
    doc["gpu_types"]["G"]["memory_gib"] = memory_gib
    doc["model"]["layers"] = [f"k{i}" for i in range(len(times))]
    doc["model"]["kinds"] = {f"k{i}": {"params": 10_000_000, "output_bytes_per_sample": 1e6 * (i + 1)}
                             for i in range(len(times))}
    doc["profiles"] = [{"gpu_type": "G", "kind": f"k{i}", "micro_batch": 1, "tp": 1,
                        "forward_ms": t, "backward_ms": 2 * t, "activation_bytes": 5e7}
                       for i, t in enumerate(times)]
    return doc


def swept(scenario: Scenario, depth: int) -> tuple[ScenarioTables, list[StageSpec], SuffixSweep]:
    """`depth` stages of one shape (inside a node) pushed into a sweep."""
    tables = compile_tables(scenario)
    return (tables, *pushed(tables, [tables.classes[0].gpu_type] * depth))


def pushed(tables: ScenarioTables, gpu_types: list[str]) -> tuple[list[StageSpec], SuffixSweep]:
    """Stages of these types at tp 1 (front first, links inside a node) pushed into a sweep,
    and their specs from the end."""
    ctx = TemplateContext(tables, Schedule.ONE_F_ONE_B)
    shapes = {c.gpu_type: StageShape(resource=c.key, tp=1) for c in tables.classes}
    link = LinkCost(latency_s=1e-5, bytes_per_s=1e10)
    specs = [ctx.stage_spec(shapes[gpu_type], 1, k, link)
             for k, gpu_type in enumerate(reversed(gpu_types), start=1)]
    sweep = SuffixSweep(tables, blocking=True, num_pipelines=1)
    for spec in specs:
        sweep.push(spec)
    return specs, sweep


@settings(max_examples=40, deadline=None)
@given(times=st.lists(st.floats(min_value=0.1, max_value=9.0), min_size=3, max_size=7),
       depth=st.integers(min_value=1, max_value=4),
       memory_gib=st.sampled_from([2.3, 2.6, 3.0, 10.0]))
def test_sweep_equals_brute_force_over_all_splits(times: list[float], depth: int,
                                                  memory_gib: float) -> None:
    scenario = parse_scenario(scenario_with(times, memory_gib))
    tables, specs, sweep = swept(scenario, depth)
    num_layers = len(times)
    best = None
    for cuts in itertools.combinations(range(1, num_layers), depth - 1):
        part = fixed_partition(tables, specs, [0, *cuts, num_layers], blocking=True,
                               num_pipelines=1)
        if part is not None and (best is None or part.bottleneck_s < best):
            best = part.bottleneck_s
    found = sweep.extract(depth) if depth <= num_layers else None
    if best is None:
        assert found is None
    else:
        assert found is not None
        assert abs(found.bottleneck_s - best) <= 1e-12 * best


@settings(max_examples=40, deadline=None)
@given(times=st.lists(st.floats(min_value=0.1, max_value=9.0), min_size=3, max_size=9),
       memory_gib=st.sampled_from([2.0, 2.2, 2.3, 2.6, 3.0]))
def test_sweep_gives_up_only_where_no_deeper_split_fits(times: list[float],
                                                        memory_gib: float) -> None:
    """`can_reach_first_layer` may stop a sweep early: no deeper pipeline may fit then."""
    tables = compile_tables(parse_scenario(scenario_with(times, memory_gib)))
    ctx = TemplateContext(tables, Schedule.ONE_F_ONE_B)
    shape = StageShape(resource=tables.classes[0].key, tp=1)
    link = LinkCost(latency_s=1e-5, bytes_per_s=1e10)
    most = len(times)
    sweep = SuffixSweep(tables, blocking=True, num_pipelines=1)
    gave_up = None
    for k in range(1, most + 1):
        sweep.push(ctx.stage_spec(shape, 1, k, link))
        if gave_up is None and not sweep.can_reach_first_layer(most - k):
            gave_up = k
    if gave_up is not None:
        assert all(sweep.depth_bottleneck(d) == float("inf") for d in range(gave_up, most + 1))


@settings(max_examples=100, deadline=None)
@given(times=st.lists(st.floats(min_value=0.1, max_value=9.0), min_size=3, max_size=9),
       memory_gib=st.sampled_from([3.2, 3.6, 4.0, 4.5, 5.0, 12.0]),
       tails=st.lists(st.integers(min_value=1, max_value=3), min_size=1, max_size=5),
       most=st.integers(min_value=1, max_value=8), other_links=st.booleans())
def test_sweeps_side_by_side_equal_sweeps_one_by_one(times: list[float], memory_gib: float,
                                                     tails: list[int], most: int,
                                                     other_links: bool) -> None:
    """`sweep_together` pushes front stages into several sweeps behind tails of different
    lengths (in front of odd ones, with `other_links`, over another link: each sweep keeps
    its own stage times in the shared step); each sweep must end exactly as if swept
    alone."""
    doc = scenario_with(times, memory_gib)
    doc["job"]["global_batch_size"] = 16  # in flight: up to 16 micro-batches
    for row in doc["profiles"]:  # activations large enough that in-flight counts bind
        row["activation_bytes"] = 3e8
    tables = compile_tables(parse_scenario(doc))
    ctx = TemplateContext(tables, Schedule.ONE_F_ONE_B)
    shape = StageShape(resource=tables.classes[0].key, tp=1)
    inner = LinkCost(latency_s=1e-5, bytes_per_s=1e10)
    crossing = LinkCost(latency_s=2e-5, bytes_per_s=1e9)

    def tail(num_back: int) -> SuffixSweep:
        sweep = SuffixSweep(tables, blocking=True, num_pipelines=1)
        for k in range(1, num_back + 1):
            sweep.push(ctx.stage_spec(shape, 1, k, inner))
        return sweep.branch(crossing, keep=num_back)

    def front(num_back: int, k: int) -> StageSpec:
        link = crossing if other_links and num_back % 2 else inner
        return ctx.stage_spec(shape, 1, num_back + k, link)

    together = [tail(n) for n in tails]
    sweep_together(together, [functools.partial(front, n) for n in tails], [most] * len(tails))
    for num_back, swept in zip(tails, together, strict=True):
        alone = tail(num_back)
        for k in range(1, most + 1):
            alone.push(front(num_back, k))
            if not (k < most and alone.extendable() and alone.can_reach_first_layer(most - k)):
                break
        assert len(swept.specs) == len(alone.specs)
        for a, b in zip(swept.best, alone.best, strict=True):
            assert np.array_equal(a, b)
        for a, b in zip(swept.choice, alone.choice, strict=True):
            assert np.array_equal(a, b)


@settings(max_examples=40, deadline=None)
@given(times=st.lists(st.floats(min_value=0.1, max_value=9.0), min_size=3, max_size=8),
       params=st.lists(st.integers(min_value=1, max_value=50), min_size=8, max_size=8),
       depth=st.integers(min_value=2, max_value=5),
       memory_gib=st.sampled_from([2.3, 2.6, 3.0, 10.0]))
def test_light_split_has_the_least_bottleneck_and_then_the_lightest_heaviest_stage(
        times: list[float], params: list[int], depth: int, memory_gib: float) -> None:
    _check_light_split(times, params, depth, memory_gib)


@settings(max_examples=80, deadline=None)
@given(times=st.lists(st.sampled_from([0.5, 1.0, 8.0]), min_size=4, max_size=10),
       params=st.lists(st.integers(min_value=1, max_value=50), min_size=10, max_size=10),
       depth=st.integers(min_value=2, max_value=6),
       memory_gib=st.sampled_from([2.6, 10.0]))
def test_light_split_among_many_ties_on_the_bottleneck(
        times: list[float], params: list[int], depth: int, memory_gib: float) -> None:
    """Few distinct layer times: one slow layer sets the bottleneck and many splits tie on
    it, so the second DP, not the first, decides the heaviest stage."""
    _check_light_split(times, params, depth, memory_gib)


def _check_light_split(times: list[float], params: list[int], depth: int,
                       memory_gib: float) -> None:
    doc = scenario_with(times, memory_gib)
    for i, kind in enumerate(doc["model"]["kinds"].values()):
        kind["params"] = params[i] * 1_000_000
    scenario = parse_scenario(doc)
    tables, specs, sweep = swept(scenario, depth)
    num_layers = len(times)
    found = sweep.extract_light(depth) if depth <= num_layers else None
    splits = []
    for cuts in itertools.combinations(range(1, num_layers), depth - 1):
        bounds = [0, *cuts, num_layers]
        part = fixed_partition(tables, specs, bounds, blocking=True, num_pipelines=1)
        if part is not None:
            heaviest = max(tables.params[e] - tables.params[s]
                           for s, e in zip(bounds, bounds[1:], strict=False))
            splits.append((part.bottleneck_s, heaviest))
    if not splits:
        assert found is None
        return
    assert found is not None
    least = min(b for b, _ in splits)
    lightest = min(h for b, h in splits if b <= least * (1 + 1e-12))
    bounds = found.bounds
    assert found.bottleneck_s <= least * (1 + 1e-9)
    assert max(tables.params[e] - tables.params[s] for s, e in zip(bounds, bounds[1:], strict=False)) \
        == lightest


@settings(max_examples=60, deadline=None)
@given(times=st.lists(st.floats(min_value=0.1, max_value=9.0), min_size=3, max_size=9),
       params=st.lists(st.integers(min_value=1, max_value=50), min_size=9, max_size=9),
       memory_gib=st.sampled_from([2.6, 3.0, 4.0, 10.0]),
       per_node=st.integers(min_value=1, max_value=4))
def test_light_splits_of_sweeps_together_equal_each_sweep_alone(
        times: list[float], params: list[int], memory_gib: float, per_node: int) -> None:
    """Sweeps that price node crossings at different stages (one per depth modulo the
    stages a node holds, as the per-type templates do): swept and light-extracted together,
    every depth's split equals the one its own sweep gives alone."""
    doc = scenario_with(times, memory_gib)
    for i, kind in enumerate(doc["model"]["kinds"].values()):
        kind["params"] = params[i] * 1_000_000
    tables = compile_tables(parse_scenario(doc))
    ctx = TemplateContext(tables, Schedule.ONE_F_ONE_B)
    shape = StageShape(resource=tables.classes[0].key, tp=1)
    inside = LinkCost(latency_s=1e-5, bytes_per_s=1e10)
    across = LinkCost(latency_s=5e-4, bytes_per_s=2e8)
    most = len(times)

    def stage(residue: int, k: int) -> StageSpec:
        return ctx.stage_spec(shape, 1, k, across if k % per_node == residue else inside)

    residues = range(per_node)
    together = [SuffixSweep(tables, blocking=True, num_pipelines=1) for _ in residues]
    sweep_together(together, [functools.partial(stage, r) for r in residues], [most] * per_node)
    depths = [list(range(1, len(sweep.specs) + 1)) for sweep in together]
    found = extract_light_together(together, depths)
    for r in residues:
        alone = SuffixSweep(tables, blocking=True, num_pipelines=1)
        for k in range(1, len(together[r].specs) + 1):
            alone.push(stage(r, k))
        for depth in depths[r]:
            expected = alone.extract_light(depth)
            assert found[r][depth] == expected


def _pipeline_time(part: Partition, num_micro_batches: int) -> float:
    return sum(part.stage_s) + (num_micro_batches - 1) * part.bottleneck_s


def two_types_swept(times: list[float], memory_gib: float, slowdown: float, fast: list[bool]
                    ) -> tuple[ScenarioTables, list[StageSpec], SuffixSweep]:
    """Stages of a fast type G and a type H `slowdown` times slower (`fast[s]` from the
    front), pushed into a sweep: where few micro-batches run, the fast ones should take most
    layers, whatever the bottleneck."""
    doc = scenario_with(times, memory_gib)
    doc["gpu_types"]["H"] = dict(doc["gpu_types"]["G"])
    doc["cluster"]["nodes"].append({"name": "h0", "gpu_type": "H", "gpus": 4})
    doc["cluster"]["intra_node"]["H"] = doc["cluster"]["intra_node"]["G"]
    doc["profiles"] += [dict(row, gpu_type="H", forward_ms=row["forward_ms"] * slowdown,
                             backward_ms=row["backward_ms"] * slowdown) for row in doc["profiles"]]
    tables = compile_tables(parse_scenario(doc))
    return (tables, *pushed(tables, ["G" if f else "H" for f in fast]))


@settings(max_examples=80, deadline=None)
@given(times=st.lists(st.floats(min_value=0.1, max_value=9.0), min_size=3, max_size=8),
       fast=st.lists(st.booleans(), min_size=2, max_size=4),
       slowdown=st.sampled_from([1.0, 1.7, 4.0]),
       memory_gib=st.sampled_from([2.6, 3.0, 10.0]),
       num_micro_batches=st.integers(min_value=1, max_value=8),
       exhaustive=st.booleans())
def test_least_time_split_equals_brute_force_over_all_splits(
        times: list[float], fast: list[bool], slowdown: float, memory_gib: float,
        num_micro_batches: int, exhaustive: bool) -> None:
    """With every cap tried, the least-time split is the best of all splits for fill +
    (m - 1) * bottleneck; with caps sampled, it still never loses to the least-bottleneck
    split. It is None only where no split beats that one by the share it looks for."""
    tables, specs, sweep = two_types_swept(times, memory_gib, slowdown, fast)
    depth, num_layers = len(fast), len(times)
    splits = [part for cuts in itertools.combinations(range(1, num_layers), depth - 1)
              if (part := fixed_partition(tables, specs, [0, *cuts, num_layers], blocking=True,
                                          num_pipelines=1)) is not None]
    least = sweep.extract(depth) if depth <= num_layers else None
    if least is None:
        assert not splits
        return
    with pytest.MonkeyPatch.context() as patch:
        if exhaustive:
            patch.setattr(partition, "LEAST_TIME_CAPS", 10**6)
        found = sweep.extract_least_time(depth, num_micro_batches)
    best = min(_pipeline_time(part, num_micro_batches) for part in splits)
    baseline = _pipeline_time(least, num_micro_batches)
    if found is None:
        if exhaustive:
            assert best >= baseline * (1 - partition.LEAST_TIME_GAIN) - 1e-12
        return
    assert found.bounds in {part.bounds for part in splits}
    assert found.stage_s == pytest.approx(next(p.stage_s for p in splits
                                               if p.bounds == found.bounds), rel=1e-9)
    assert _pipeline_time(found, num_micro_batches) < baseline
    if exhaustive:
        assert abs(_pipeline_time(found, num_micro_batches) - best) <= 1e-9 * best


def test_few_micro_batches_put_most_layers_on_the_fast_stage() -> None:
    """Hand-worked: 8 equal layers, 3 ms each (forward and backward) on G and 4.5 ms on H,
    G in front of H; the transfer after layer i (i + 1 MB at 10 GB/s, plus 10 us) is charged
    forward and backward to both stages. Least bottleneck: 5 layers on G (15 + 2.04 ms), 3
    on H (13.5 + 2.04 ms). With 2 micro-batches that split is also the fastest (about 43.5
    ms; 6 + 2 gives about 45). With 1 micro-batch only the fill counts: 7 + 1 (21 + 4.5 +
    4 * 0.71 = 28.34 ms) beats 5 + 3 (about 32.6 ms)."""
    tables, _, sweep = two_types_swept([1.0] * 8, 10.0, 1.5, [True, False])
    least = sweep.extract(2)
    assert least is not None and least.bounds == (0, 5, 8)
    assert sweep.extract_least_time(2, 2) is None
    found = sweep.extract_least_time(2, 1)
    assert found is not None and found.bounds == (0, 7, 8)
    assert sum(found.stage_s) == pytest.approx(0.0255 + 4 * 0.00071, rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(params=st.lists(st.integers(min_value=1, max_value=50), min_size=1, max_size=9))
def test_least_heaviest_stage_of_each_depth_equals_brute_force(params: list[int]) -> None:
    doc = scenario_with([1.0] * len(params), 10.0)
    for i, kind in enumerate(doc["model"]["kinds"].values()):
        kind["params"] = params[i] * 1_000_000
    tables = compile_tables(parse_scenario(doc))
    least = partition._least_heaviest(tables)
    prefix = tables.params
    for depth in range(1, len(params) + 1):
        brute = min(max(prefix[e] - prefix[s] for s, e in itertools.pairwise([0, *cuts, len(params)]))
                    for cuts in itertools.combinations(range(1, len(params)), depth - 1))
        assert least[depth] == brute


@settings(max_examples=40, deadline=None)
@given(times=st.lists(st.floats(min_value=0.1, max_value=9.0), min_size=3, max_size=8),
       params=st.lists(st.sampled_from([1, 2, 10]), min_size=8, max_size=8),
       memory_gib=st.sampled_from([2.6, 3.0, 10.0]))
def test_light_splits_taken_without_the_second_dp_are_as_light_as_its_own(
        times: list[float], params: list[int], memory_gib: float) -> None:
    """Where the least-bottleneck split already reaches the least heaviest stage any split
    can have, it is taken as the light one: as light as what the second DP finds."""
    doc = scenario_with(times, memory_gib)
    for i, kind in enumerate(doc["model"]["kinds"].values()):
        kind["params"] = params[i] * 1_000_000
    scenario = parse_scenario(doc)

    def heaviest(tables: ScenarioTables, part: Partition | None) -> float | None:
        return None if part is None else max(
            tables.params[e] - tables.params[s] for s, e in itertools.pairwise(part.bounds))

    found = {}
    for skipping in (True, False):
        tables, _, sweep = swept(scenario, len(times))
        if not skipping:  # every depth through the second DP
            sweep.lightest_possible = lambda *args: False  # type: ignore[method-assign]
        found[skipping] = [heaviest(tables, sweep.extract_light(d))
                           for d in range(2, len(times) + 1)]
    assert found[True] == found[False]
