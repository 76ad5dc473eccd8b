"""The default estimator: validate a plan and compute COST_MODEL.md's numbers.

`evaluate(scenario, plan)` reports every violated rule of section 2 and, when
the plan's shape allows it, the section 3 and 4 numbers: per-pipeline time
from the event simulation, sync, iteration time, throughput, per-GPU memory.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field
from typing import Any

from planner.bounds import compute_bound_s
from planner.costs import (
    GIB,
    NodeIndex,
    ProfileIndex,
    in_flight,
    link_between,
    ring_cost,
    ring_hop,
    state_bytes_per_param,
    transfer_s,
)
from planner.documents import Node, Pipeline, Plan, Scenario, Schedule, Stage
from planner.simulate import simulate_pipeline

__all__ = [
    "StageEstimate", "PipelineEstimate", "Evaluation", "evaluate", "plan_schedule",
    "simulate_estimate",
]


@dataclass(kw_only=True, slots=True)
class StageEstimate:
    gpu_type: str
    tp: int
    gpus: list[str]
    layers: list[int]
    forward_ms: float
    backward_ms: float
    effective_forward_ms: float
    effective_backward_ms: float
    transfer_to_next_s: float | None
    sync_s: float
    in_flight: int
    state_bytes: float
    activation_bytes: float
    memory_bytes: float
    memory_gib: float
    reserved_gib: float
    capacity_gib: float
    fits: bool


@dataclass(kw_only=True, slots=True)
class PipelineEstimate:
    index: int
    micro_batch_size: int
    num_micro_batches: int
    samples: int
    num_stages: int
    T_p: float
    blocking_transfers: bool
    stages: list[StageEstimate]
    schedule: str = Schedule.ONE_F_ONE_B.value


@dataclass(kw_only=True)
class Evaluation:
    valid: bool
    errors: list[str]
    warnings: list[str] = field(default_factory=list)
    iteration_s: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    sync_s: float | None = None
    blocking_transfers: bool = True
    schedule: str = Schedule.ONE_F_ONE_B.value
    shared_nics: dict[str, dict[str, float]] = field(default_factory=dict)
    estimate_iteration_s: float | None = None
    estimate_rel_error: float | None = None
    compute_bound_iteration_s: float | None = None
    efficiency: float | None = None
    pipelines: list[PipelineEstimate] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_schedule(scenario: Scenario, plan: Plan) -> Schedule:
    return plan.schedule or scenario.job.schedule


def evaluate(scenario: Scenario, plan: Plan) -> Evaluation:
    """Validate `plan` against `scenario` and estimate it with the reference model."""
    nodes = NodeIndex(scenario)
    profiles = ProfileIndex(scenario.profiles)
    schedule = plan_schedule(scenario, plan)
    errors = _structure_errors(scenario, plan, nodes, profiles)
    bound = compute_bound_s(scenario)
    result = Evaluation(
        valid=False, errors=errors, schedule=schedule.value,
        blocking_transfers=scenario.job.blocking_transfers,
        compute_bound_iteration_s=bound,
    )
    if errors:
        return result
    nic_share = _nic_share(scenario, plan, nodes)
    share = {name: s for name, (_, s) in nic_share.items()}
    first_nodes = [[_first_node(stage, nodes) for stage in p.stages] for p in plan.pipelines]
    sync = _sync_per_stage(scenario, plan, first_nodes, share)
    if len(plan.pipelines) > 1:  # interfaces are shared by the sync only
        result.shared_nics = {
            name: {"nics": nodes.by_name[name].num_nics, "used_gpus": used, "share": s}
            for name, (used, s) in sorted(nic_share.items()) if s < 1.0
        }
    layer_sums: dict[tuple[str, int, int, int, int], tuple[float, float, float, float]] = {}
    result.pipelines = [
        _estimate_pipeline(scenario, plan, i, first_nodes[i], profiles, schedule, sync[i],
                           layer_sums)
        for i in range(len(plan.pipelines))
    ]
    for p in result.pipelines:
        for s, stage in enumerate(p.stages):
            if not stage.fits:
                errors.append(
                    f"pipelines[{p.index}].stages[{s}]: needs {stage.memory_gib:.2f} GiB per GPU "
                    f"but {stage.gpu_type} has {stage.capacity_gib:g} GiB; use more stages, a "
                    f"higher tp or a smaller micro-batch")
    result.sync_s = max(s.sync_s for p in result.pipelines for s in p.stages)
    result.iteration_s = max(p.T_p for p in result.pipelines) + result.sync_s
    result.samples_per_s = scenario.job.global_batch_size / result.iteration_s
    result.tokens_per_s = result.samples_per_s * scenario.model.seq_len
    result.efficiency = None if bound is None else bound / result.iteration_s
    result.valid = not errors
    _compare_with_plan_estimate(plan, result)
    return result


def _compare_with_plan_estimate(plan: Plan, result: Evaluation) -> None:
    claimed = (plan.estimate or {}).get("iteration_s")
    if isinstance(claimed, int | float) and claimed > 0 and result.iteration_s is not None:
        result.estimate_iteration_s = float(claimed)
        result.estimate_rel_error = (result.iteration_s - claimed) / claimed
        if abs(result.estimate_rel_error) > 1e-6:
            result.warnings.append(
                f"estimate.iteration_s {claimed:g} differs from the reference model's "
                f"{result.iteration_s:g} ({result.estimate_rel_error:+.2%})")


def _structure_errors(
    scenario: Scenario, plan: Plan, nodes: NodeIndex, profiles: ProfileIndex
) -> list[str]:
    """Every section 2 rule except memory, which needs the numbers."""
    errors: list[str] = []
    num_layers = len(scenario.model.layers)
    owner: dict[str, str] = {}
    missing: dict[tuple[str, int, int, int, int], list[str]] = {}
    total = 0
    for i, pipeline in enumerate(plan.pipelines):
        where = f"pipelines[{i}]"
        b, m = pipeline.micro_batch_size, pipeline.num_micro_batches
        if b < 1 or m < 1:
            errors.append(f"{where}: micro_batch_size ({b}) and num_micro_batches ({m}) "
                          "must be at least 1")
        total += b * m
        expected_start = 0
        for s, stage in enumerate(pipeline.stages):
            here = f"{where}.stages[{s}]"
            errors.extend(_stage_gpu_errors(here, stage, nodes, owner))
            start, end = stage.layers
            if start != expected_start or end <= start or end > num_layers:
                errors.append(f"{here}.layers: [{start}, {end}) does not continue the pipeline at "
                              f"layer {expected_start} with a non-empty range inside [0, "
                              f"{num_layers})")
            expected_start = end
            # Replicas repeat the same stages: check each distinct one's profiles once.
            key = (stage.gpu_type, stage.tp, b, start, end)
            if key not in missing:
                missing[key] = _missing_profiles(scenario, stage, b, profiles)
            errors.extend(f"{here}: {problem}" for problem in missing[key])
        if expected_start != num_layers:
            errors.append(f"{where}: stages end at layer {expected_start}, not at {num_layers}; "
                          "they must cover every layer")
    if total != scenario.job.global_batch_size:
        errors.append(f"pipelines: sum of micro_batch_size * num_micro_batches is {total}, "
                      f"not the global batch {scenario.job.global_batch_size}")
    return errors


def _stage_gpu_errors(
    here: str, stage: Stage, nodes: NodeIndex, owner: dict[str, str]
) -> list[str]:
    errors = []
    if stage.tp < 1 or len(stage.gpus) != stage.tp:
        errors.append(f"{here}: tp is {stage.tp} but the stage lists {len(stage.gpus)} GPU(s); "
                      "a stage has exactly tp GPUs")
    stage_nodes = set()
    for gpu in stage.gpus:
        located = nodes.locate(gpu)
        if located is None:
            errors.append(f"{here}.gpus: {gpu!r} names no GPU of the cluster (use node:index)")
            continue
        node, _ = located
        stage_nodes.add(node.name)
        if node.gpu_type != stage.gpu_type:
            errors.append(f"{here}.gpus: {gpu!r} is a {node.gpu_type}, not a {stage.gpu_type}")
        if gpu in owner:
            errors.append(f"{here}.gpus: {gpu!r} is already used by {owner[gpu]}")
        owner[gpu] = here
    if len(stage_nodes) > 1:
        errors.append(f"{here}.gpus: spread over nodes {sorted(stage_nodes)}; a stage's GPUs "
                      "must sit on one node")
    return errors


def _missing_profiles(
    scenario: Scenario, stage: Stage, b: int, profiles: ProfileIndex
) -> list[str]:
    start, end = stage.layers
    kinds = sorted(set(scenario.model.layers[max(start, 0):max(end, 0)]))
    return [
        f"no profile row for ({stage.gpu_type}, {kind}, micro_batch {b}, tp {stage.tp}); "
        "profile that point or choose a profiled micro-batch size and tp"
        for kind in kinds if profiles.get(stage.gpu_type, kind, b, stage.tp) is None
    ]


def _nic_share(scenario: Scenario, plan: Plan, nodes: NodeIndex) -> dict[str, tuple[int, float]]:
    """Per used node: (distinct GPUs used, interface share min(1, nics / used))."""
    used: dict[str, set[str]] = {}
    for pipeline in plan.pipelines:
        for stage in pipeline.stages:
            for gpu in stage.gpus:
                used.setdefault(gpu.rpartition(":")[0], set()).add(gpu)
    return {
        name: (len(gpus), min(1.0, nodes.by_name[name].num_nics / len(gpus)))
        for name, gpus in used.items()
    }


def _first_node(stage: Stage, nodes: NodeIndex) -> Node:
    located = nodes.locate(stage.gpus[0])
    assert located is not None, "structure was validated"
    return located[0]


def _sync_per_stage(
    scenario: Scenario, plan: Plan, first_nodes: list[list[Node]], nic_share: dict[str, float]
) -> list[list[float]]:
    """Gradient-sync seconds of every stage: per-layer rings in pipeline order."""
    n = len(plan.pipelines)
    sync = [[0.0] * len(p.stages) for p in plan.pipelines]
    if n == 1:
        return sync
    model = scenario.model
    grad_bytes = scenario.job.grad_bytes
    holder_of_layer = [_layer_holders(p, len(model.layers)) for p in plan.pipelines]
    hop_cache: dict[tuple[str, str], tuple[float, float]] = {}
    ring: tuple[float, float] = (0.0, 0.0)
    previous: list[int] | None = None
    for layer, kind in enumerate(model.layers):
        holders = [holder_of_layer[p][layer] for p in range(n)]
        # Consecutive layers held by the same stages share one ring.
        if holders != previous:
            ring_nodes = [first_nodes[p][s] for p, s in enumerate(holders)]
            hops = []
            for a, b in zip(ring_nodes, ring_nodes[1:] + ring_nodes[:1], strict=True):
                key = (a.name, b.name)
                if key not in hop_cache:
                    hop_cache[key] = ring_hop(scenario, a, b, nic_share)
                hops.append(hop_cache[key])
            ring, previous = ring_cost(hops), holders
        bandwidth, latency = ring
        params = model.kinds[kind].params
        for p, s in enumerate(holders):
            tp = plan.pipelines[p].stages[s].tp
            sync[p][s] += (2 * (n - 1) / n * params * grad_bytes / tp / bandwidth
                           + 2 * (n - 1) * latency)
    return sync


def _layer_holders(pipeline: Pipeline, num_layers: int) -> list[int]:
    holder = [0] * num_layers
    for s, stage in enumerate(pipeline.stages):
        for layer in range(stage.layers[0], stage.layers[1]):
            holder[layer] = s
    return holder


@functools.lru_cache(maxsize=4096)
def _simulate(
    forward_s: tuple[float, ...],
    backward_s: tuple[float, ...],
    transfer_s: tuple[float, ...],
    num_micro_batches: int,
    schedule: Schedule,
    blocking: bool,
) -> float:
    """Data-parallel replicas repeat the same pipeline: simulate each shape once."""
    return simulate_pipeline(forward_s, backward_s, transfer_s, num_micro_batches, schedule,
                             blocking_transfers=blocking)


def simulate_estimate(estimate: PipelineEstimate, num_micro_batches: int) -> float:
    """The time of an estimated pipeline's stages run with `num_micro_batches`."""
    if num_micro_batches <= 0:
        return 0.0
    stages = estimate.stages
    return _simulate(
        tuple(s.effective_forward_ms * 1e-3 for s in stages),
        tuple(s.effective_backward_ms * 1e-3 for s in stages),
        tuple(s.transfer_to_next_s or 0.0 for s in stages[:-1]),
        num_micro_batches, Schedule(estimate.schedule), estimate.blocking_transfers)


def _estimate_pipeline(
    scenario: Scenario,
    plan: Plan,
    index: int,
    first_nodes: list[Node],
    profiles: ProfileIndex,
    schedule: Schedule,
    sync: list[float],
    layer_sums: dict[tuple[str, int, int, int, int], tuple[float, float, float, float]],
) -> PipelineEstimate:
    pipeline = plan.pipelines[index]
    model, job = scenario.model, scenario.job
    b, m = pipeline.micro_batch_size, pipeline.num_micro_batches
    num_stages = len(pipeline.stages)
    state_per_param = state_bytes_per_param(scenario, len(plan.pipelines)).total
    transfers = [
        transfer_s(link_between(scenario, first_nodes[s], first_nodes[s + 1]),
                   model.kinds[model.layers[stage.layers[1] - 1]].output_bytes_per_sample * b)
        for s, stage in enumerate(pipeline.stages[:-1])
    ]
    stages = []
    for s, stage in enumerate(pipeline.stages):
        key = (stage.gpu_type, stage.tp, b, stage.layers[0], stage.layers[1])
        if key not in layer_sums:
            layer_sums[key] = _layer_sums(scenario, profiles, stage, b)
        forward_ms, backward_ms, activation_bytes, params = layer_sums[key]
        around_s = (transfers[s - 1] if s > 0 else 0.0) + (transfers[s] if s < len(transfers) else 0.0)
        blocking_ms = around_s * 1e3 if job.blocking_transfers else 0.0
        flight = in_flight(s, num_stages, m, schedule)
        state = params / stage.tp * state_per_param
        acts = flight * activation_bytes
        reserved = scenario.reserved_gib(stage.gpu_type)
        memory = state + acts + reserved * GIB
        capacity = scenario.gpu_types[stage.gpu_type].memory_gib
        stages.append(StageEstimate(
            gpu_type=stage.gpu_type, tp=stage.tp, gpus=list(stage.gpus),
            layers=list(stage.layers), forward_ms=forward_ms, backward_ms=backward_ms,
            effective_forward_ms=forward_ms + blocking_ms,
            effective_backward_ms=backward_ms + blocking_ms,
            transfer_to_next_s=transfers[s] if s < len(transfers) else None,
            sync_s=sync[s], in_flight=flight, state_bytes=state, activation_bytes=acts,
            memory_bytes=memory, memory_gib=memory / GIB, reserved_gib=reserved,
            capacity_gib=capacity, fits=memory <= capacity * GIB,
        ))
    estimate = PipelineEstimate(
        index=index, micro_batch_size=b, num_micro_batches=m, samples=b * m,
        num_stages=num_stages, T_p=0.0, blocking_transfers=job.blocking_transfers,
        stages=stages, schedule=schedule.value,
    )
    estimate.T_p = simulate_estimate(estimate, m)
    return estimate


def _layer_sums(
    scenario: Scenario, profiles: ProfileIndex, stage: Stage, b: int
) -> tuple[float, float, float, float]:
    """(forward ms, backward ms, activation bytes, parameters) of a stage's layers.
    Replicas repeat the same stages: `evaluate` computes each distinct one once."""
    model = scenario.model
    kinds = model.layers[stage.layers[0]:stage.layers[1]]
    rows = [profiles.get(stage.gpu_type, kind, b, stage.tp) for kind in kinds]
    return (sum(r.forward_ms for r in rows if r is not None),
            sum(r.backward_ms for r in rows if r is not None),
            sum(r.activation_bytes for r in rows if r is not None),
            sum(model.kinds[k].params for k in kinds))
