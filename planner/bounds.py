"""The compute bound of docs/formats.md (Bounds and baselines): no plan can beat it."""

from __future__ import annotations

import weakref
from collections import Counter

from planner.costs import ProfileIndex
from planner.documents import Scenario

__all__ = ["seconds_per_sample_per_gpu", "compute_bound_s"]


def seconds_per_sample_per_gpu(
    scenario: Scenario, gpu_type: str, profiles: ProfileIndex | None = None
) -> float | None:
    """`c_g`: the least GPU-seconds one sample costs on `gpu_type` over complete (b, tp) points."""
    profiles = profiles or ProfileIndex(scenario.profiles)
    layers = scenario.model.layers
    best = None
    for b, tp in profiles.complete_points(gpu_type, set(layers)):
        per_kind = {}
        for kind in set(layers):
            row = profiles.get(gpu_type, kind, b, tp)
            assert row is not None
            per_kind[kind] = row.forward_ms + row.backward_ms
        ms = 0.0
        for kind in layers:  # summed layer by layer, in order, as the document defines it
            ms += per_kind[kind]
        cost = tp * ms * 1e-3 / b
        best = cost if best is None else min(best, cost)
    return best


_known: dict[int, tuple[weakref.ref[Scenario], float | None]] = {}


def compute_bound_s(scenario: Scenario) -> float | None:
    """global_batch / sum_g(N_g / c_g), or None when no GPU type can run the model at all.
    Scenario documents are frozen: each one's bound is computed once (the estimator asks
    for it at every plan it judges)."""
    key = id(scenario)
    known = _known.get(key)
    if known is not None and known[0]() is scenario:
        return known[1]
    bound = _compute_bound_s(scenario)
    _known[key] = (weakref.ref(scenario, lambda _: _known.pop(key, None)), bound)
    return bound


def _compute_bound_s(scenario: Scenario) -> float | None:
    gpus = Counter[str]()
    for node in scenario.cluster.nodes:
        gpus[node.gpu_type] += node.gpus
    profiles = ProfileIndex(scenario.profiles)
    rate = 0.0
    for gpu_type, count in gpus.items():
        cost = seconds_per_sample_per_gpu(scenario, gpu_type, profiles)
        if cost is not None and cost > 0:
            rate += count / cost
    return scenario.job.global_batch_size / rate if rate > 0 else None
