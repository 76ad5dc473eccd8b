"""Exact mode equals an independent brute force, and bounds the heuristic search."""

from __future__ import annotations

import itertools

import pytest

from planner import SearchOptions, evaluate, parse_plan, parse_scenario, plan
from planner.search.exact import TooLargeForExact
from tests.planner.scenarios import tiny


def three_gpu_scenario(batch: int, slow: float) -> dict:
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


def brute_force_best(doc: dict) -> float:
    """Label each GPU with (pipeline, stage) or nothing; try every split, size and share."""
    scenario = parse_scenario(doc)
    gpus = [("n0:0", "G"), ("n0:1", "G"), ("s0:0", "S")]
    labels = [None] + [(p, s) for p in range(3) for s in range(2)]
    best = 0.0
    for assignment in itertools.product(labels, repeat=len(gpus)):
        pipelines: dict[int, dict[int, tuple[str, str]]] = {}
        ok = True
        for gpu, label in zip(gpus, assignment, strict=True):
            if label is None:
                continue
            stages = pipelines.setdefault(label[0], {})
            ok = ok and label[1] not in stages
            stages[label[1]] = gpu
        ids = sorted(pipelines)
        if not ok or not ids or ids != list(range(len(ids))) or any(
                sorted(st) != list(range(len(st))) for st in pipelines.values()):
            continue
        shapes = [[pipelines[p][s] for s in range(len(pipelines[p]))] for p in ids]
        splits = [[(0, 2)] if len(sh) == 1 else [(0, 1, 2)] for sh in shapes]
        for sizes in itertools.product([1, 2], repeat=len(shapes)):
            for shares in itertools.product(range(1, doc["job"]["global_batch_size"] + 1),
                                            repeat=len(shapes)):
                if sum(b * m for b, m in zip(sizes, shares, strict=True)) != \
                        doc["job"]["global_batch_size"]:
                    continue
                for split in itertools.product(*splits):
                    document = {"format": "hetplan-plan/1", "pipelines": [
                        {"micro_batch_size": b, "num_micro_batches": m, "stages": [
                            {"gpu_type": t, "tp": 1, "gpus": [g],
                             "layers": [bounds[s], bounds[s + 1]]}
                            for s, (g, t) in enumerate(shape)]}
                        for shape, b, m, bounds in zip(shapes, sizes, shares, split, strict=True)]}
                    result = evaluate(scenario, parse_plan(document))
                    if result.valid and result.samples_per_s:
                        best = max(best, result.samples_per_s)
    return best


@pytest.mark.parametrize(("batch", "slow"), [(2, 1.0), (4, 2.5), (6, 1.5)])
def test_exact_mode_equals_brute_force(batch: int, slow: float) -> None:
    doc = three_gpu_scenario(batch, slow)
    result = plan(parse_scenario(doc), SearchOptions(exact=True))
    assert result.status.value == "optimal"
    assert result.evaluation.samples_per_s == pytest.approx(brute_force_best(doc), rel=1e-12)


@pytest.mark.parametrize(("batch", "slow"), [(4, 2.5), (6, 1.5)])
def test_heuristic_search_is_never_better_than_exact(batch: int, slow: float) -> None:
    scenario = parse_scenario(three_gpu_scenario(batch, slow))
    exact = plan(scenario, SearchOptions(exact=True)).evaluation.samples_per_s
    heuristic = plan(scenario, SearchOptions(time_limit_s=2)).evaluation.samples_per_s
    assert exact is not None and heuristic is not None
    assert heuristic <= exact * (1 + 1e-12)
    # And on these tiny cases it finds the optimum.
    assert heuristic == pytest.approx(exact, rel=0.01)


def test_exact_mode_refuses_large_scenarios_with_the_limit() -> None:
    doc = tiny()
    doc["model"]["layers"] = ["a"] + ["b"] * 9
    doc["job"]["global_batch_size"] = 64
    with pytest.raises(TooLargeForExact, match="at most 200000 plans"):
        plan(parse_scenario(doc), SearchOptions(exact=True))
