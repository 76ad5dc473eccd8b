"""Bounds no plan can beat: the compute bound of docs/formats.md (Bounds and baselines), and
a floor under one plan's iteration that needs no simulation."""

from __future__ import annotations

from planner.costs import (
    NodeIndex,
    ProfileIndex,
    chunk_transfers_s,
    node_index,
    per_scenario,
    profile_index,
    range_index,
)
from planner.documents import Pipeline, Plan, Scenario, Schedule
from planner.schedules import model_chunks
from planner.simulate import floor_s

__all__ = ["seconds_per_sample_per_gpu", "compute_bound_s", "iteration_floor_s"]


def seconds_per_sample_per_gpu(
    scenario: Scenario, gpu_type: str, profiles: ProfileIndex | None = None
) -> float | None:
    """`c_g`: the least GPU-seconds one sample costs on `gpu_type` over complete (b, tp) points."""
    profiles = profiles or profile_index(scenario)
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


@per_scenario
def compute_bound_s(scenario: Scenario) -> float | None:
    """global_batch / sum_g(N_g / c_g), or None when no GPU type can run the model at all
    (computed once per scenario: the estimator asks for it at every plan it judges)."""
    profiles = profile_index(scenario)
    rate = 0.0
    for gpu_type, count in scenario.cluster.gpus_per_type.items():
        cost = seconds_per_sample_per_gpu(scenario, gpu_type, profiles)
        if cost is not None and cost > 0:
            rate += count / cost
    return scenario.job.global_batch_size / rate if rate > 0 else None


def iteration_floor_s(scenario: Scenario, plan: Plan) -> float | None:
    """A lower bound on the plan's iteration time, without simulating it: per pipeline
    `planner.simulate.floor_s` over its chunks' operation times (a stage's micro-batches
    times all its work, with the fill no stage escapes), and sync only adds. None where the
    plan names a GPU or needs a profile row the scenario lacks (the estimator says which)."""
    nodes, profiles = node_index(scenario), profile_index(scenario)
    schedule = plan.schedule or scenario.job.schedule
    floor = 0.0
    for pipeline in plan.pipelines:
        times = _chunk_times_s(scenario, nodes, profiles, schedule, pipeline)
        if times is None:
            return None
        floor = max(floor, floor_s(*times, len(pipeline.stages), pipeline.num_micro_batches,
                                   schedule, blocking_transfers=scenario.job.blocking_transfers))
    return floor


def _chunk_times_s(scenario: Scenario, nodes: NodeIndex, profiles: ProfileIndex,
                   schedule: Schedule, pipeline: Pipeline
                   ) -> tuple[list[float], list[float], list[float]] | None:
    """Seconds of one forward and one backward of each model chunk, as the estimator times
    them (blocking transfers, a recomputed forward and a local head included), and the
    transfers between consecutive chunks."""
    b = pipeline.micro_batch_size
    stages, ranges = pipeline.stages, model_chunks(pipeline)
    located = [nodes.locate(stage.gpus[0]) if stage.gpus else None for stage in stages]
    if any(where is None for where in located):
        return None
    first = [where[0] for where in located if where is not None]
    num_stages = len(stages)
    transfers = chunk_transfers_s(scenario, first, ranges, b)
    head_kind = scenario.job.local_head_kind if schedule is Schedule.LOCAL else None
    forwards, backwards = [], []
    sums_of = range_index(scenario).sums
    for c, (start, end) in enumerate(ranges):
        s = c % num_stages
        stage = stages[s]
        forward_ms, backward_ms, _, _, complete = sums_of(stage.gpu_type, stage.tp, b, start, end)
        if not complete:
            return None
        forward, backward = forward_ms * 1e-3, backward_ms * 1e-3
        if head_kind is not None and s < num_stages - 1:  # every stage but the last trains one
            head = profiles.get(stage.gpu_type, head_kind, b, stage.tp)
            if head is None:
                return None
            backward += (head.forward_ms + head.backward_ms) * 1e-3
        around = ((transfers[c - 1] if c > 0 else 0.0) + (transfers[c] if c < len(transfers)
                                                           else 0.0))
        blocking = around if scenario.job.blocking_transfers else 0.0
        sent_back = 0.0 if schedule is Schedule.LOCAL else blocking
        forwards.append(forward + blocking)
        backwards.append(backward + sent_back + (forward if stage.recompute else 0.0))
    return forwards, backwards, transfers
