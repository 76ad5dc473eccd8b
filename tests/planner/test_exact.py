"""Exact mode equals independent brute forces and known optima, and refuses large inputs."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner import SearchOptions, evaluate, parse_plan, parse_scenario, plan
from planner.search.exact import MAX_GPUS, MAX_LAYERS, TooLargeForExact, exact_optimum
from planner.space_bound import space_bound
from tests.planner.scenarios import tiny

TINY = Path(__file__).resolve().parent.parent / "data" / "tiny"
TINY_NAMES = sorted(p.stem for p in TINY.glob("tiny-*.json") if not p.stem.endswith(".optimum"))


def brute_force_best(doc: dict[str, Any]) -> float:
    """Label every GPU with (pipeline, stage) or nothing; GPUs of one label form a stage
    (its tp); try every split, micro-batch size and batch share. Shares nothing with the
    search but the estimator."""
    scenario = parse_scenario(doc)
    gpus = [(f"{n.name}:{i}", n.name, n.gpu_type) for n in scenario.cluster.nodes
            for i in range(n.gpus)]
    num_layers = len(scenario.model.layers)
    batch = scenario.job.global_batch_size
    rows = {(r.gpu_type, r.micro_batch, r.tp) for r in scenario.profiles}
    sizes = sorted({r.micro_batch for r in scenario.profiles})
    labels = [None] + [(p, s) for p in range(len(gpus)) for s in range(min(len(gpus), num_layers))]
    best = 0.0
    for assignment in itertools.product(labels, repeat=len(gpus)):
        groups: dict[tuple[int, int], list[tuple[str, str, str]]] = {}
        for gpu, label in zip(gpus, assignment, strict=True):
            if label is not None:
                groups.setdefault(label, []).append(gpu)
        pipelines = sorted({p for p, _ in groups})
        if not pipelines or pipelines != list(range(len(pipelines))):
            continue
        shapes = []
        for p in pipelines:
            stages = sorted(s for q, s in groups if q == p)
            if stages != list(range(len(stages))):
                break
            shapes.append([groups[(p, s)] for s in stages])
        else:
            if any(len({g[1] for g in st}) > 1 for sh in shapes for st in sh):
                continue
            best = max(best, _best_over_splits(scenario, shapes, rows, sizes, num_layers, batch))
    return best


def _best_over_splits(scenario: Any, shapes: list[list[list[tuple[str, str, str]]]],
                      rows: set[tuple[str, int, int]], sizes: list[int], num_layers: int,
                      batch: int) -> float:
    best = 0.0
    splits = [[(0, *cuts, num_layers) for cuts in
               itertools.combinations(range(1, num_layers), len(shape) - 1)] for shape in shapes]
    for bs in itertools.product(sizes, repeat=len(shapes)):
        if any((stage[0][2], b, len(stage)) not in rows for shape, b in zip(shapes, bs, strict=True)
               for stage in shape):
            continue
        for shares in itertools.product(range(1, batch + 1), repeat=len(shapes)):
            if sum(b * m for b, m in zip(bs, shares, strict=True)) != batch:
                continue
            for split in itertools.product(*splits):
                document = {"format": "hetplan-plan/1", "pipelines": [
                    {"micro_batch_size": b, "num_micro_batches": m, "stages": [
                        {"gpu_type": stage[0][2], "tp": len(stage), "gpus": [g[0] for g in stage],
                         "layers": [bounds[s], bounds[s + 1]]}
                        for s, stage in enumerate(shape)]}
                    for shape, b, m, bounds in zip(shapes, bs, shares, split, strict=True)]}
                result = evaluate(scenario, parse_plan(document))
                if result.valid and result.samples_per_s:
                    best = max(best, result.samples_per_s)
    return best


def three_gpu_scenario(batch: int, slow: float) -> dict[str, Any]:
    doc = tiny()
    doc["gpu_types"]["S"] = {"memory_gib": 10}
    doc["cluster"]["nodes"] = [{"name": "n0", "gpu_type": "G", "gpus": 2, "nics": 1},
                               {"name": "s0", "gpu_type": "S", "gpus": 1}]
    doc["cluster"]["intra_node"]["S"] = {"bandwidth_gb_per_s": 100, "latency_us": 0}
    doc["profiles"] += [dict(r, gpu_type="S", forward_ms=r["forward_ms"] * slow,
                             backward_ms=r["backward_ms"] * slow) for r in doc["profiles"]]
    doc["profiles"] += [dict(r, micro_batch=2, forward_ms=r["forward_ms"] * 1.6,
                             backward_ms=r["backward_ms"] * 1.6,
                             activation_bytes=r["activation_bytes"] * 2) for r in doc["profiles"]]
    doc["job"]["global_batch_size"] = batch
    return doc


@st.composite
def random_tiny(draw: st.DrawFn) -> dict[str, Any]:
    """Two or three GPUs of one or two types, two or three layers, tp 1 or 2, b 1 or 2,
    random speeds, memory, links, interfaces, batch, schedule and transfer model."""
    doc = tiny()
    kinds = ["a", "b"]
    doc["model"]["layers"] = draw(st.lists(st.sampled_from(kinds), min_size=2, max_size=3))
    doc["model"]["kinds"] = {k: {"params": draw(st.integers(10**5, 10**8)),
                                 "output_bytes_per_sample": draw(st.integers(0, 10**7))}
                             for k in kinds}
    two_types = draw(st.booleans())
    sizes = draw(st.sampled_from([[1, 1], [2], [2, 1], [1, 1, 1]]))
    nodes, types = [], {}
    for i, gpus in enumerate(sizes):
        gpu_type = "S" if two_types and i == len(sizes) - 1 else "G"
        types[gpu_type] = None
        nodes.append({"name": f"n{i}", "gpu_type": gpu_type, "gpus": gpus,
                      "nics": draw(st.integers(1, 2))})
    doc["cluster"]["nodes"] = nodes
    doc["gpu_types"] = {t: {"memory_gib": draw(st.sampled_from([0.5, 2.0, 10.0]))} for t in types}
    doc["cluster"]["intra_node"] = {t: {"bandwidth_gb_per_s": draw(st.sampled_from([5, 100])),
                                        "latency_us": draw(st.sampled_from([0, 20]))} for t in types}
    doc["cluster"]["inter_node"] = {"bandwidth_gb_per_s": draw(st.sampled_from([1, 10])),
                                    "latency_us": draw(st.sampled_from([0, 50]))}
    rows = []
    for t in types:
        speed = draw(st.sampled_from([1.0, 2.5]))
        for k in kinds:
            base = draw(st.floats(0.5, 5.0))
            for b in (1, 2):
                for tp in (1, 2):
                    rows.append({"gpu_type": t, "kind": k, "micro_batch": b, "tp": tp,
                                 "forward_ms": round(base * speed * b * (0.6 if tp == 2 else 1), 3),
                                 "backward_ms": round(2 * base * speed * b * (0.6 if tp == 2 else 1), 3),
                                 "activation_bytes": draw(st.integers(10**5, 10**8)) * b // tp})
    doc["profiles"] = rows
    doc["job"] = {"global_batch_size": draw(st.integers(2, 4)), "grad_bytes": 4,
                  "reserved_gib": 0.0, "schedule": draw(st.sampled_from(["1f1b", "gpipe"])),
                  "blocking_transfers": draw(st.booleans())}
    return doc


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_tiny())
def test_exact_mode_equals_brute_force_on_random_tiny_scenarios(doc: dict[str, Any]) -> None:
    expected = brute_force_best(doc)
    scenario = parse_scenario(doc)
    found = exact_optimum(scenario)
    if expected == 0.0:
        assert found is None
        return
    assert found is not None and found.proven
    assert found.evaluation.samples_per_s == pytest.approx(expected, rel=1e-9)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_tiny())
def test_no_optimum_beats_the_upper_bound(doc: dict[str, Any]) -> None:
    # Random tiny scenarios put transfers and rings over slow links beside fast compute:
    # where the bound's crossing, sync and fill terms would overreach, an optimum shows it.
    assert_optimum_within_the_bound(doc)


def assert_optimum_within_the_bound(doc: dict[str, Any]) -> None:
    scenario = parse_scenario(doc)
    found = exact_optimum(scenario)
    bound = space_bound(scenario)
    if found is None or not found.evaluation.samples_per_s:
        return
    assert bound is not None
    assert found.evaluation.samples_per_s <= bound.samples_per_s


@st.composite
def random_four_gpus(draw: st.DrawFn) -> dict[str, Any]:
    """`random_tiny` on four GPUs, nodes of two GPUs among them, links between nodes from
    ten times slower than the slowest of `random_tiny` to as fast: where up to a node's worth
    of pipelines can keep some rings inside nodes and not others."""
    doc = draw(random_tiny())
    sizes = draw(st.sampled_from([[2, 2], [2, 1, 1], [3, 1]]))
    types = list(doc["gpu_types"])
    doc["cluster"]["nodes"] = [
        {"name": f"n{i}", "gpu_type": types[-1] if i == len(sizes) - 1 else types[0],
         "gpus": gpus, "nics": draw(st.integers(1, 2))} for i, gpus in enumerate(sizes)]
    doc["cluster"]["inter_node"]["bandwidth_gb_per_s"] = draw(st.sampled_from([0.1, 1, 10]))
    return doc


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_four_gpus())
def test_no_optimum_on_two_gpu_nodes_beats_the_upper_bound(doc: dict[str, Any]) -> None:
    assert_optimum_within_the_bound(doc)


@pytest.mark.parametrize(("batch", "slow"), [(2, 1.0), (4, 2.5), (6, 1.5)])
def test_exact_mode_equals_brute_force(batch: int, slow: float) -> None:
    doc = three_gpu_scenario(batch, slow)
    result = plan(parse_scenario(doc), SearchOptions(exact=True))
    assert result.status.value == "optimal"
    assert result.evaluation.samples_per_s == pytest.approx(brute_force_best(doc), rel=1e-12)


def _tiny_case(name: str) -> tuple[Any, float]:
    scenario = parse_scenario(json.loads((TINY / f"{name}.json").read_text()))
    optimum = json.loads((TINY / f"{name}.optimum.json").read_text())["samples_per_s"]
    return scenario, optimum


@pytest.mark.parametrize("name", TINY_NAMES)
def test_exact_mode_equals_the_known_optimum(name: str) -> None:
    scenario, optimum = _tiny_case(name)
    result = plan(scenario, SearchOptions(exact=True, time_limit_s=300))
    assert result.status.value == "optimal"
    assert result.evaluation.samples_per_s == pytest.approx(optimum, rel=1e-9)
    assert optimum <= result.plan.search["upper_bound_samples_per_s"]


@pytest.mark.parametrize("name", TINY_NAMES)
def test_default_search_comes_within_one_percent_of_the_known_optimum(name: str) -> None:
    scenario, optimum = _tiny_case(name)
    # A generous limit: the default search spends most of it enumerating small scenarios,
    # and a loaded CI machine should not decide the outcome.
    found = plan(scenario, SearchOptions(time_limit_s=60)).evaluation.samples_per_s
    assert found is not None
    assert optimum * 0.99 <= found <= optimum * (1 + 1e-9)


def test_exact_mode_stops_at_its_time_limit_with_the_best_plan_so_far() -> None:
    scenario, _ = _tiny_case("tiny-h100x4-a80x4-gpt6.7b-8l")
    result = plan(scenario, SearchOptions(exact=True, time_limit_s=1))
    assert result.status.value == "heuristic"
    assert "stopped at the time limit" in result.plan.search["origin"]
    assert result.wall_s < 30  # the whole enumeration takes minutes


def test_exact_mode_refuses_too_many_gpus_with_the_limit() -> None:
    doc = tiny()
    doc["cluster"]["nodes"] = [{"name": f"n{i}", "gpu_type": "G", "gpus": 8} for i in range(3)]
    with pytest.raises(TooLargeForExact, match=f"at most {MAX_GPUS} GPUs"):
        plan(parse_scenario(doc), SearchOptions(exact=True))


def test_exact_mode_refuses_too_many_layers_with_the_limit() -> None:
    doc = tiny()
    doc["model"]["layers"] = ["a"] + ["b"] * MAX_LAYERS
    with pytest.raises(TooLargeForExact, match=f"at most {MAX_LAYERS} layers"):
        plan(parse_scenario(doc), SearchOptions(exact=True))


def test_exact_mode_refuses_too_many_structures_with_the_limit() -> None:
    doc = tiny()
    doc["model"]["layers"] = ["a"] + ["b"] * 13
    doc["profiles"] += [dict(r, tp=tp) for r in doc["profiles"] for tp in (2, 4)]
    with pytest.raises(TooLargeForExact, match="pipeline structures"):
        plan(parse_scenario(doc), SearchOptions(exact=True))
