"""The default estimator: validate a plan and compute the numbers of docs/formats.md.

`evaluate(scenario, plan)` reports every violated rule of sections 2 and 6 and,
when the plan's shape allows it, the numbers of sections 3, 4, 6 and 7:
per-pipeline time from the event simulation, sync, iteration time, throughput,
per-GPU memory, price.

Two paths compute a pipeline. Version-1 pipelines (1F1B or GPipe, one layer
range per stage, no recomputation), which the search evaluates thousands of
times, take the plain path: per-stage sums and a closed-form processing order.
Every other pipeline (interleaved chunks, local heads, recomputation) takes the
general path: per-model-chunk sums, each stage's operation order, memory as the
peak of what that order holds.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from planner.bounds import compute_bound_s
from planner.costs import (
    GIB,
    NodeIndex,
    ProfileIndex,
    RangeIndex,
    chunk_transfers_s,
    in_flight,
    link_between,
    node_index,
    profile_index,
    range_index,
    ring_cost,
    ring_hop,
    state_bytes_per_param,
    transfer_s,
)
from planner.documents import LayerRange, Node, Pipeline, Plan, ProfileRow, Scenario, Schedule, Stage
from planner.schedules import chunk_layout_errors, held_peak, model_chunks, schedule_errors
from planner.simulate import simulate_chunks, simulate_pipeline, stage_operations

__all__ = [
    "StageEstimate", "ChunkedStageEstimate", "PipelineEstimate", "Evaluation", "evaluate", "plan_schedule",
    "overflows_memory", "simulate_estimate", "estimate_section", "with_estimate", "dominates", "PricedRate",
]


@dataclass(kw_only=True, slots=True)
class StageEstimate:
    """One stage's numbers. Times per micro-batch; `effective_*` add blocking transfers,
    recomputation and a local head; a chunked stage's times sum over its chunks."""

    gpu_type: str
    tp: int
    gpus: list[str]
    layers: list[int] | None
    """The stage's one layer range; None for a stage of several chunks (see `chunks`)."""
    forward_ms: float
    backward_ms: float
    """Sum of the layers' backward_ms, without the recomputed forward or a local head."""
    effective_forward_ms: float
    effective_backward_ms: float
    transfer_to_next_s: float | None
    """To the next stage; None on the last stage and on stages of several chunks."""
    sync_s: float
    in_flight: int
    """Most micro-batch forwards (of any chunk) whose activations the stage holds at once."""
    state_bytes: float
    activation_bytes: float
    """All activation memory: the held peak plus, when recomputing, one layer's workspace."""
    memory_bytes: float
    memory_gib: float
    reserved_gib: float
    capacity_gib: float
    fits: bool
    activation_peak_bytes: float
    """Most bytes the forwards of the stage's layers hold at once over its operation order
    (inputs only when recomputing); a local head's activations come on top."""
    recompute: bool = False


@dataclass(kw_only=True, slots=True)
class ChunkedStageEstimate(StageEstimate):
    """A stage estimated on the general path (section 6): its numbers per chunk, in the
    stage's chunk order, with recomputation and the local head spelled out. The plain
    path, which the search runs thousands of times, builds the leaner `StageEstimate`."""

    chunks: list[list[int]]
    chunk_forward_ms: list[float]
    chunk_backward_ms: list[float]
    chunk_effective_forward_ms: list[float]
    chunk_effective_backward_ms: list[float]
    chunk_transfer_to_next_s: list[float | None]
    chunk_activation_bytes: list[float]
    recompute_input_bytes: list[float] | None = None
    """Per chunk: the input a recomputing stage keeps per micro-batch (0 from layer 0)."""
    recompute_max_activation_bytes: float | None = None
    """The largest layer activation (head included under local), held once to recompute."""
    # Schedule local, every stage but the last: the auxiliary head it trains through.
    head_kind: str | None = None
    head_forward_ms: float | None = None
    head_backward_ms: float | None = None
    head_activation_bytes: float | None = None
    head_params: int | None = None


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
    num_chunks: int = 1
    """Chunks per stage (interleaved-1f1b); 1 otherwise."""


@dataclass(kw_only=True)
class Evaluation:
    valid: bool
    errors: list[str]
    warnings: list[str] = field(default_factory=list)
    iteration_s: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    usd_per_hour: float | None = None
    """hourly_usd summed over the distinct GPUs the plan uses; None if one has no price."""
    usd_per_million_tokens: float | None = None
    usd_per_iteration: float | None = None
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


class PricedRate(Protocol):
    """Anything with a throughput and a price, such as an `Evaluation`."""

    @property
    def samples_per_s(self) -> float | None: ...

    @property
    def usd_per_hour(self) -> float | None: ...


def dominates(a: PricedRate, b: PricedRate) -> bool:
    """Whether `a` is at least as fast and at most as dear as `b`, and better in one of the
    two (section 7). Plans without a throughput or a price dominate nothing and nothing
    dominates them."""
    if None in (a.samples_per_s, a.usd_per_hour, b.samples_per_s, b.usd_per_hour):
        return False
    assert a.samples_per_s is not None and a.usd_per_hour is not None
    assert b.samples_per_s is not None and b.usd_per_hour is not None
    no_worse = a.samples_per_s >= b.samples_per_s and a.usd_per_hour <= b.usd_per_hour
    return no_worse and (a.samples_per_s > b.samples_per_s or a.usd_per_hour < b.usd_per_hour)


def estimate_section(evaluation: Evaluation) -> dict[str, float]:
    """The `estimate` section of a plan document: speed, and price where it is known."""
    keys = ("iteration_s", "samples_per_s", "tokens_per_s", "usd_per_hour",
            "usd_per_million_tokens", "usd_per_iteration")
    values = {key: getattr(evaluation, key) for key in keys}
    return {key: value for key, value in values.items() if value is not None}


def with_estimate(plan: Plan, evaluation: Evaluation) -> Plan:
    """`plan` with `estimate_section(evaluation)` merged into its `estimate` section."""
    section = {**(plan.estimate or {}), **estimate_section(evaluation)}
    return plan if section == plan.estimate else plan.model_copy(update={"estimate": section})


def plan_schedule(scenario: Scenario, plan: Plan) -> Schedule:
    return plan.schedule or scenario.job.schedule


def evaluate(scenario: Scenario, plan: Plan) -> Evaluation:
    """Validate `plan` against `scenario` and estimate it with the reference model."""
    nodes = node_index(scenario)
    profiles = profile_index(scenario)
    schedule = plan_schedule(scenario, plan)
    version_1 = _is_version_1(plan, schedule)
    errors = _structure_errors(scenario, plan, nodes, profiles, may_have_chunks=not version_1)
    if not version_1:
        errors += schedule_errors(scenario, plan, schedule, profiles)
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
    sync = _sync_per_stage(scenario, plan, first_nodes, share, schedule)
    if len(plan.pipelines) > 1:  # interfaces are shared by the sync only
        result.shared_nics = {
            name: {"nics": nodes.by_name[name].num_nics, "used_gpus": used, "share": s}
            for name, (used, s) in sorted(nic_share.items()) if s < 1.0
        }
    ctx = _Context.of(scenario, plan, profiles, schedule)
    result.pipelines = [ctx.estimate(i, first_nodes[i], sync[i], version_1=version_1)
                        for i in range(len(plan.pipelines))]
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
    _price(result, _usd_per_hour(scenario, nodes, nic_share))
    if schedule is Schedule.LOCAL:
        result.warnings.append(
            f"schedule 'local': every stage but the last learns from its own loss through head "
            f"kind {scenario.job.local_head_kind!r}, so training is not end-to-end "
            "backpropagation and may reach a different model")
    result.valid = not errors
    _compare_with_plan_estimate(plan, result)
    return result


def overflows_memory(scenario: Scenario, plan: Plan, indices: Iterable[int]) -> bool:
    """Whether some stage of the plan's pipelines at `indices` needs more memory than its
    GPUs have, as `evaluate` would find it (the same per-pipeline estimate), without
    validating the plan or estimating its sync and other pipelines: a cheap screen for
    plans that differ from a judged one in those pipelines only. True means `evaluate`
    finds the plan invalid; False says nothing about the rest of the plan."""
    nodes = node_index(scenario)
    profiles = profile_index(scenario)
    schedule = plan_schedule(scenario, plan)
    general = not _is_version_1(plan, schedule)
    if general and schedule_errors(scenario, plan, schedule, profiles):
        return False  # a shape the simulation cannot run: the estimator says why
    num_layers = len(scenario.model.layers)
    ctx = _Context.of(scenario, plan, profiles, schedule)
    for i in indices:
        pipeline = plan.pipelines[i]
        located = [nodes.locate(stage.gpus[0]) if stage.gpus else None
                   for stage in pipeline.stages]
        if any(where is None for where in located) or not all(
                0 <= start < end <= num_layers for stage in pipeline.stages
                for start, end in stage.ranges):
            continue  # the estimator would report the GPU or range: leave the plan to it
        first = [where[0] for where in located if where is not None]
        estimate = ctx.estimate(i, first, [0.0] * len(pipeline.stages), version_1=not general,
                                simulated=False)
        if not all(stage.fits for stage in estimate.stages):
            return True
    return False


def _usd_per_hour(
    scenario: Scenario, nodes: NodeIndex, nic_share: dict[str, tuple[int, float]]
) -> float | None:
    """Section 7: the price of every distinct GPU the plan uses; None if one has none."""
    total = 0.0
    for name, (used, _) in nic_share.items():
        price = scenario.gpu_types[nodes.by_name[name].gpu_type].hourly_usd
        if price is None:
            return None
        total += used * price
    return total


def _price(result: Evaluation, usd_per_hour: float | None) -> None:
    result.usd_per_hour = usd_per_hour
    # A plan that never finishes (an iteration of infinite time: no tokens) has no price
    # per token or per iteration.
    if (usd_per_hour is None or result.iteration_s is None or not result.tokens_per_s
            or not math.isfinite(result.iteration_s)):
        return
    result.usd_per_million_tokens = usd_per_hour / 3600 / result.tokens_per_s * 1e6
    result.usd_per_iteration = usd_per_hour / 3600 * result.iteration_s


def _is_version_1(plan: Plan, schedule: Schedule) -> bool:
    """1F1B or GPipe, one range and no recomputation on every stage: what the search evaluates
    thousands of times, checked in one pass so that it skips every section 6 rule."""
    if schedule is not Schedule.ONE_F_ONE_B and schedule is not Schedule.GPIPE:
        return False
    for pipeline in plan.pipelines:  # loops, not any(): this runs on every search candidate
        for stage in pipeline.stages:
            if stage.chunks is not None or stage.recompute:
                return False
    return True


def _needs_general_path(pipeline: Pipeline, schedule: Schedule) -> bool:
    if schedule is Schedule.INTERLEAVED_1F1B or schedule is Schedule.LOCAL:
        return True
    return any(stage.recompute for stage in pipeline.stages)


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
    scenario: Scenario, plan: Plan, nodes: NodeIndex, profiles: ProfileIndex, *,
    may_have_chunks: bool,
) -> list[str]:
    """Every section 2 rule except memory, which needs the numbers, and the chunk layout of
    section 6 (the other section 6 rules are `schedule_errors`)."""
    errors: list[str] = []
    num_layers = len(scenario.model.layers)
    owner: dict[str, str] = {}
    missing: dict[tuple[object, ...], list[str]] = {}
    total = 0
    for i, pipeline in enumerate(plan.pipelines):
        where = f"pipelines[{i}]"
        b, m = pipeline.micro_batch_size, pipeline.num_micro_batches
        if b < 1 or m < 1:
            errors.append(f"{where}: micro_batch_size ({b}) and num_micro_batches ({m}) "
                          "must be at least 1")
        total += b * m
        chunked = may_have_chunks and any(stage.chunks is not None for stage in pipeline.stages)
        expected_start = 0
        for s, stage in enumerate(pipeline.stages):
            here = f"{where}.stages[{s}]"
            errors.extend(_stage_gpu_errors(here, stage, nodes, owner))
            if not chunked:
                start, end = stage.single_range or stage.layers  # the field, read fast
                if start != expected_start or end <= start or end > num_layers:
                    errors.append(f"{here}.layers: [{start}, {end}) does not continue the pipeline "
                                  f"at layer {expected_start} with a non-empty range inside [0, "
                                  f"{num_layers})")
                expected_start = end
            # Replicas repeat the same stages: check each distinct one's profiles once.
            key = ((stage.gpu_type, stage.tp, b, start, end) if not chunked else
                   (stage.gpu_type, stage.tp, b, *(bound for r in stage.ranges for bound in r)))
            if key not in missing:
                missing[key] = _missing_profiles(scenario, stage, b, profiles)
            errors.extend(f"{here}: {problem}" for problem in missing[key])
        if chunked:
            errors.extend(chunk_layout_errors(where, pipeline, num_layers))
        elif expected_start != num_layers:
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
    kinds = sorted({kind for start, end in stage.ranges
                    for kind in scenario.model.layers[max(start, 0):max(end, 0)]})
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
    scenario: Scenario,
    plan: Plan,
    first_nodes: list[list[Node]],
    nic_share: dict[str, float],
    schedule: Schedule,
) -> list[list[float]]:
    """Gradient-sync seconds of every stage: per-layer rings in pipeline order, and under
    `local` one more ring per stage but the last for its head."""
    n = len(plan.pipelines)
    sync = [[0.0] * len(p.stages) for p in plan.pipelines]
    if n == 1:
        return sync
    model = scenario.model
    grad_bytes = scenario.job.grad_bytes
    holder_of_layer = [_layer_holders(p, len(model.layers)) for p in plan.pipelines]
    # What is all-reduced: every layer among the stages holding it, in pipeline order; under
    # local each stage's head too (every pipeline has the same stages: validated).
    rings = [([holder_of_layer[p][layer] for p in range(n)], model.kinds[kind].params)
             for layer, kind in enumerate(model.layers)]
    head = scenario.job.local_head_kind
    if schedule is Schedule.LOCAL and head is not None:
        rings += [([s] * n, model.kinds[head].params)
                  for s in range(len(plan.pipelines[0].stages) - 1)]
    hop_cache: dict[tuple[str, str], tuple[float, float]] = {}
    ring: tuple[float, float] = (0.0, 0.0)
    previous: list[int] | None = None
    share, steps = 2 * (n - 1) / n, 2 * (n - 1)  # of the bytes, and ring steps
    tps = [[stage.tp for stage in pipeline.stages] for pipeline in plan.pipelines]
    for holders, params in rings:
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
        volume, waits = share * params * grad_bytes, steps * latency
        for p, s in enumerate(holders):
            sync[p][s] += volume / tps[p][s] / bandwidth + waits
    return sync


def _layer_holders(pipeline: Pipeline, num_layers: int) -> list[int]:
    holder = [0] * num_layers
    for s, stage in enumerate(pipeline.stages):
        if stage.chunks is None:
            start, end = stage.single_range or stage.layers  # the field, read fast
            holder[start:end] = [s] * (end - start)
            continue
        for start, end in stage.chunks:
            holder[start:end] = [s] * (end - start)
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


@functools.lru_cache(maxsize=1024)
def _simulate_chunks(
    forward_s: tuple[float, ...],
    backward_s: tuple[float, ...],
    transfer_s: tuple[float, ...],
    num_stages: int,
    num_micro_batches: int,
    schedule: Schedule,
    blocking: bool,
) -> float:
    return simulate_chunks(forward_s, backward_s, transfer_s, num_stages, num_micro_batches,
                           schedule, blocking_transfers=blocking)


def simulate_estimate(estimate: PipelineEstimate, num_micro_batches: int) -> float:
    """The time of an estimated pipeline's stages run with `num_micro_batches`."""
    if num_micro_batches <= 0:
        return 0.0
    stages = estimate.stages
    if isinstance(stages[0], ChunkedStageEstimate):  # the general path
        forward_s, backward_s, transfers = _by_model_chunk(estimate)
        return _simulate_chunks(forward_s, backward_s, transfers, len(stages), num_micro_batches,
                                Schedule(estimate.schedule), estimate.blocking_transfers)
    return _simulate(
        tuple(s.effective_forward_ms * 1e-3 for s in stages),
        tuple(s.effective_backward_ms * 1e-3 for s in stages),
        tuple(s.transfer_to_next_s or 0.0 for s in stages[:-1]),
        num_micro_batches, Schedule(estimate.schedule), estimate.blocking_transfers)


def _by_model_chunk(
    estimate: PipelineEstimate,
) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
    """Effective forward and backward seconds per model chunk, and the transfers between
    consecutive chunks, from a general-path estimate's per-stage chunk lists."""
    forward, backward, transfers = [], [], []
    num_stages = len(estimate.stages)
    for c in range(num_stages * estimate.num_chunks):
        stage, j = estimate.stages[c % num_stages], c // num_stages
        assert isinstance(stage, ChunkedStageEstimate), "the general path builds every stage"
        forward.append(stage.chunk_effective_forward_ms[j] * 1e-3)
        backward.append(stage.chunk_effective_backward_ms[j] * 1e-3)
        transfers.append(stage.chunk_transfer_to_next_s[j] or 0.0)
    return tuple(forward), tuple(backward), tuple(transfers[:-1])


@dataclass(frozen=True, kw_only=True, slots=True)
class _Context:
    """What every pipeline's estimate reads, and the sums its replicas share."""

    scenario: Scenario
    plan: Plan
    profiles: ProfileIndex
    schedule: Schedule
    state_per_param: float
    ranges: RangeIndex

    @classmethod
    def of(cls, scenario: Scenario, plan: Plan, profiles: ProfileIndex, schedule: Schedule
           ) -> _Context:
        return cls(scenario=scenario, plan=plan, profiles=profiles, schedule=schedule,
                   state_per_param=state_bytes_per_param(scenario, len(plan.pipelines)).total,
                   ranges=range_index(scenario))

    def estimate(self, index: int, first_nodes: list[Node], sync: list[float], *,
                 version_1: bool, simulated: bool = True) -> PipelineEstimate:
        """Pipeline `index`'s estimate: the version-1 path where the whole plan is version 1
        or this pipeline needs nothing of section 6, else the general one. Without
        `simulated`, its time `T_p` is left at 0 (a memory screen needs none)."""
        pipeline = self.plan.pipelines[index]
        general = not version_1 and _needs_general_path(pipeline, self.schedule)
        estimate = (_estimate_general_pipeline if general else _estimate_pipeline)(
            self, index, first_nodes, sync)
        if simulated:
            estimate.T_p = simulate_estimate(estimate, pipeline.num_micro_batches)
        return estimate


def _estimate_pipeline(
    ctx: _Context, index: int, first_nodes: list[Node], sync: list[float]
) -> PipelineEstimate:
    """Sections 3 and 4: one range per stage, 1F1B or GPipe, no recomputation (`T_p` is
    the caller's to simulate: `_Context.estimate`)."""
    scenario, schedule, state_per_param = ctx.scenario, ctx.schedule, ctx.state_per_param
    sums_of = ctx.ranges.sums  # read inline below: this path runs on every search candidate
    pipeline = ctx.plan.pipelines[index]
    model, job = scenario.model, scenario.job
    b, m = pipeline.micro_batch_size, pipeline.num_micro_batches
    num_stages = len(pipeline.stages)
    ranges = [stage.single_range or stage.layers for stage in pipeline.stages]  # read fast
    transfers = [
        transfer_s(link_between(scenario, first_nodes[s], first_nodes[s + 1]),
                   model.kinds[model.layers[end - 1]].output_bytes_per_sample * b)
        for s, (_, end) in enumerate(ranges[:-1])
    ]
    stages = []
    for s, stage in enumerate(pipeline.stages):
        start, end = ranges[s]
        forward_ms, backward_ms, activation_bytes, params, _ = sums_of(
            stage.gpu_type, stage.tp, b, start, end)
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
            layers=list(ranges[s]), forward_ms=forward_ms, backward_ms=backward_ms,
            effective_forward_ms=forward_ms + blocking_ms,
            effective_backward_ms=backward_ms + blocking_ms,
            transfer_to_next_s=transfers[s] if s < len(transfers) else None,
            sync_s=sync[s], in_flight=flight, state_bytes=state, activation_bytes=acts,
            memory_bytes=memory, memory_gib=memory / GIB, reserved_gib=reserved,
            capacity_gib=capacity, fits=memory <= capacity * GIB, activation_peak_bytes=acts,
        ))
    estimate = PipelineEstimate(
        index=index, micro_batch_size=b, num_micro_batches=m, samples=b * m,
        num_stages=num_stages, T_p=0.0, blocking_transfers=job.blocking_transfers,
        stages=stages, schedule=schedule.value,
    )
    return estimate


@dataclass(frozen=True, kw_only=True, slots=True)
class _ChunkSums:
    """Sums over one model chunk's layers at its stage's (type, b, tp), in ms and bytes."""

    forward_ms: float
    backward_ms: float
    activation_bytes: float
    params: float
    input_bytes: float
    """What the chunk receives per micro-batch: its first layer's predecessor's output."""


def _chunk_sums(ctx: _Context, stage: Stage, b: int, layer_range: LayerRange) -> _ChunkSums:
    forward_ms, backward_ms, activation_bytes, params, _ = ctx.ranges.sums(
        stage.gpu_type, stage.tp, b, *layer_range)
    model, start = ctx.scenario.model, layer_range[0]
    input_bytes = model.kinds[model.layers[start - 1]].output_bytes_per_sample * b if start else 0.0
    return _ChunkSums(forward_ms=forward_ms, backward_ms=backward_ms,
                      activation_bytes=activation_bytes, params=params, input_bytes=input_bytes)


def _local_head(ctx: _Context, stage: Stage, s: int, num_stages: int, b: int) -> ProfileRow | None:
    """The head row a stage trains through: under `local`, on every stage but the last."""
    head = ctx.scenario.job.local_head_kind
    if ctx.schedule is not Schedule.LOCAL or head is None or s == num_stages - 1:
        return None
    return ctx.profiles.get(stage.gpu_type, head, b, stage.tp)


def _estimate_general_pipeline(
    ctx: _Context, index: int, first_nodes: list[Node], sync: list[float]
) -> PipelineEstimate:
    """Section 6: any schedule, chunks, local heads and recomputation, per model chunk
    (`T_p` is the caller's to simulate: `_Context.estimate`)."""
    scenario = ctx.scenario
    pipeline = ctx.plan.pipelines[index]
    job = scenario.job
    b, m = pipeline.micro_batch_size, pipeline.num_micro_batches
    num_stages = len(pipeline.stages)
    num_chunks = pipeline.stages[0].num_chunks
    ranges = model_chunks(pipeline)
    sums = [_chunk_sums(ctx, pipeline.stages[c % num_stages], b, r) for c, r in enumerate(ranges)]
    transfers = chunk_transfers_s(scenario, first_nodes, ranges, b)
    stages: list[StageEstimate] = [_general_stage(ctx, pipeline, s, sums, transfers, sync[s])
                                   for s in range(num_stages)]
    estimate = PipelineEstimate(
        index=index, micro_batch_size=b, num_micro_batches=m, samples=b * m,
        num_stages=num_stages, T_p=0.0, blocking_transfers=job.blocking_transfers,
        stages=stages, schedule=ctx.schedule.value, num_chunks=num_chunks,
    )
    return estimate


def _general_stage(
    ctx: _Context,
    pipeline: Pipeline,
    s: int,
    sums: list[_ChunkSums],
    transfers: list[float],
    sync_s: float,
) -> ChunkedStageEstimate:
    scenario, schedule = ctx.scenario, ctx.schedule
    stage, num_stages = pipeline.stages[s], len(pipeline.stages)
    b = pipeline.micro_batch_size
    mine = list(range(s, len(sums), num_stages))  # this stage's model chunks, in chunk order
    head = _local_head(ctx, stage, s, num_stages, b)
    head_ms = 0.0 if head is None else head.forward_ms + head.backward_ms
    blocking = scenario.job.blocking_transfers
    forward_ms, backward_ms, transfer_out = [], [], []
    for c in mine:
        around_s = (transfers[c - 1] if c > 0 else 0.0) + (transfers[c] if c < len(transfers) else 0.0)
        blocking_ms = around_s * 1e3 if blocking else 0.0
        recomputed_ms = sums[c].forward_ms if stage.recompute else 0.0
        forward_ms.append(sums[c].forward_ms + blocking_ms)
        # Under local nothing is sent backward: a backward carries no transfer.
        sent_back_ms = 0.0 if schedule is Schedule.LOCAL else blocking_ms
        backward_ms.append(head_ms + recomputed_ms + sums[c].backward_ms + sent_back_ms)
        transfer_out.append(transfers[c] if c < len(transfers) else None)
    memory = _general_memory(ctx, pipeline, s, sums, mine, head)
    capacity = scenario.gpu_types[stage.gpu_type].memory_gib
    head_kind = scenario.job.local_head_kind if head is not None else None
    one_range = len(mine) == 1
    return ChunkedStageEstimate(
        gpu_type=stage.gpu_type, tp=stage.tp, gpus=list(stage.gpus),
        layers=list(stage.ranges[0]) if one_range else None,
        forward_ms=sum(sums[c].forward_ms for c in mine),
        backward_ms=sum(sums[c].backward_ms for c in mine),
        effective_forward_ms=sum(forward_ms), effective_backward_ms=sum(backward_ms),
        transfer_to_next_s=transfer_out[0] if one_range else None,
        sync_s=sync_s, in_flight=memory.in_flight, state_bytes=memory.state_bytes,
        activation_bytes=memory.activation_bytes, memory_bytes=memory.total_bytes,
        memory_gib=memory.total_bytes / GIB, reserved_gib=memory.reserved_gib,
        capacity_gib=capacity, fits=memory.total_bytes <= capacity * GIB,
        activation_peak_bytes=memory.peak_bytes, recompute=stage.recompute,
        recompute_input_bytes=[sums[c].input_bytes for c in mine] if stage.recompute else None,
        recompute_max_activation_bytes=memory.once_bytes if stage.recompute else None,
        chunks=[list(r) for r in stage.ranges],
        chunk_forward_ms=[sums[c].forward_ms for c in mine],
        chunk_backward_ms=[sums[c].backward_ms for c in mine],
        chunk_effective_forward_ms=forward_ms, chunk_effective_backward_ms=backward_ms,
        chunk_transfer_to_next_s=transfer_out,
        chunk_activation_bytes=[sums[c].activation_bytes for c in mine],
        head_kind=head_kind,
        head_forward_ms=None if head is None else head.forward_ms,
        head_backward_ms=None if head is None else head.backward_ms,
        head_activation_bytes=None if head is None else head.activation_bytes,
        head_params=None if head_kind is None else scenario.model.kinds[head_kind].params,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class _StageMemory:
    in_flight: int
    peak_bytes: float
    """The peak of what the layers' forwards hold over the stage's order."""
    once_bytes: float
    """Held once besides: the recompute workspace, or else a local head's activations (one
    micro-batch is in flight under local)."""
    state_bytes: float
    reserved_gib: float

    @property
    def activation_bytes(self) -> float:
        return self.peak_bytes + self.once_bytes

    @property
    def total_bytes(self) -> float:
        return self.state_bytes + self.activation_bytes + self.reserved_gib * GIB


def _general_memory(
    ctx: _Context,
    pipeline: Pipeline,
    s: int,
    sums: list[_ChunkSums],
    mine: list[int],
    head: ProfileRow | None,
) -> _StageMemory:
    """Activations as the peak over the stage's own order of what its forwards hold: their
    layers' activations, or only their inputs when recomputing. Held once besides: the
    local head's activations, or when recomputing one layer's activations (the largest,
    head included) to recompute into."""
    scenario = ctx.scenario
    stage, b = pipeline.stages[s], pipeline.micro_batch_size
    head_acts = 0.0 if head is None else head.activation_bytes
    if stage.recompute:
        held = {c: sums[c].input_bytes for c in mine}
        once = max([head_acts, *(_largest_activation(scenario, ctx.profiles, stage, b, r)
                                 for r in stage.ranges)])
    else:
        held = {c: sums[c].activation_bytes for c in mine}
        once = head_acts
    in_flight, peak = _stage_peak(s, len(pipeline.stages), pipeline.num_micro_batches,
                                  ctx.schedule, stage.num_chunks, tuple(sorted(held.items())))
    params = sum(sums[c].params for c in mine)
    if head is not None:
        head_kind = scenario.job.local_head_kind
        assert head_kind is not None, "a head row implies a head kind"
        params += scenario.model.kinds[head_kind].params
    return _StageMemory(in_flight=in_flight, peak_bytes=peak, once_bytes=once,
                        state_bytes=params / stage.tp * ctx.state_per_param,
                        reserved_gib=scenario.reserved_gib(stage.gpu_type))


@functools.lru_cache(maxsize=4096)
def _stage_peak(stage: int, num_stages: int, num_micro_batches: int, schedule: Schedule,
                num_chunks: int, held: tuple[tuple[int, float], ...]) -> tuple[int, float]:
    """`held_peak` over one stage's order: data-parallel replicas (and the variants a
    search judges) repeat the same stages, and an interleaved order is m * v long."""
    order = stage_operations(stage, num_stages, num_micro_batches, schedule, num_chunks)
    return held_peak(order, dict(held))


def _largest_activation(
    scenario: Scenario, profiles: ProfileIndex, stage: Stage, b: int, layer_range: LayerRange
) -> float:
    rows = (profiles.get(stage.gpu_type, kind, b, stage.tp)
            for kind in set(scenario.model.layers[layer_range[0]:layer_range[1]]))
    return max((row.activation_bytes for row in rows if row is not None), default=0.0)
