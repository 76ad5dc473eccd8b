"""Schedules beyond the one the templates model: interleaving, recomputation, local learning.

The templates and the allocation plan 1F1B- and GPipe-shaped pipelines. Two steps here
widen that without touching them:

- `schedule_variants` takes the best plans found and builds, for the schedules the options
  allow, variants the estimator then judges: the plan under another allowed schedule;
  interleaved virtual stages (`v` chunks per stage, each stage's layers cut into chunks of
  about equal compute on its own GPUs, in pipelines whose micro-batch count is a multiple
  of their depth, the others keeping `v = 1`, which the contract allows); and, where
  recomputation is allowed, larger micro-batches (fewer of them, the pipeline's samples
  unchanged), recomputation set on exactly the stages that then overflow memory. A plan
  made invalid by memory alone is repaired the same way. The fastest valid plan wins.
- `common_blocks` makes candidate plans valid under `local`, whose pipelines must share
  their stage boundaries (the blocks): for plans whose pipelines all have the same depth
  it chooses one split for all of them, minimising the slowest stage over every pipeline
  (a least-bottleneck DP over layers, memory checked per pipeline).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from planner.bounds import iteration_floor_s
from planner.costs import profile_index, state_bytes_per_param
from planner.documents import Pipeline, Plan, Scenario, Schedule, Stage
from planner.errors import InvalidScenario, Problem
from planner.estimate import Evaluation, evaluate
from planner.search.drafts import Candidate
from planner.search.tables import ScenarioTables

__all__ = [
    "LOCAL_TRAINING_NOTE",
    "allowed_schedules",
    "base_scenario",
    "common_blocks",
    "schedule_variants",
]

LOCAL_TRAINING_NOTE = "local learning (PPLL): not equivalent to end-to-end backpropagation"
MAX_VIRTUAL_STAGES = 4
"""Largest `v` tried: the bubble shrinks as 1/v while transfers grow as v."""
MICRO_BATCH_FACTORS = (2, 4, 8)
"""Micro-batch growth tried with recomputation (each needs a profiled point)."""
VARIANT_BASES = 3
"""Best plans of the search from which variants are built."""
ROUNDING = 1e-9
"""The floor is summed in another order than the estimator's: a margin for that."""


def allowed_schedules(scenario: Scenario, requested: Sequence[Schedule]) -> tuple[Schedule, ...]:
    """The schedules a plan may use: `requested`, or the job's own when none is given.
    `local` changes what training computes: it is planned for a `local` job only, and a
    `local` job is planned with nothing else."""
    job_schedule = scenario.job.schedule
    allowed = tuple(dict.fromkeys(requested)) or (job_schedule,)
    if Schedule.LOCAL in allowed and job_schedule is not Schedule.LOCAL:
        raise InvalidScenario([Problem(
            path="job.schedule", value=job_schedule.value,
            message="the search options allow schedule 'local', which only a job whose schedule "
                    "is 'local' may run (it trains each block on its own loss); set "
                    "job.schedule to 'local' or leave 'local' out of the options' schedules")])
    if job_schedule is Schedule.LOCAL and allowed != (Schedule.LOCAL,):
        others = [s.value for s in allowed if s is not Schedule.LOCAL]
        raise InvalidScenario([Problem(
            path="job.schedule", value=job_schedule.value,
            message=f"the search options allow {others} for a 'local' job; those schedules "
                    "train end to end, which is not what the job asks: allow only 'local', or "
                    "change job.schedule")])
    return allowed


def base_scenario(scenario: Scenario) -> Scenario:
    """The scenario the templates and the allocation plan: an interleaved job is planned as
    1F1B first (a pipeline of one chunk per stage runs the 1F1B order), then interleaved."""
    if scenario.job.schedule is not Schedule.INTERLEAVED_1F1B:
        return scenario
    job = scenario.job.model_copy(update={"schedule": Schedule.ONE_F_ONE_B})
    return scenario.model_copy(update={"job": job})


# --- local learning: one set of blocks for every pipeline -------------------------------


def common_blocks(
    tables: ScenarioTables, candidates: Iterable[Candidate], limit: int | None = None,
) -> list[Candidate]:
    """Of the candidates whose pipelines all have the same depth, the `limit` of least quick
    estimate (all where None), each with one layer split shared by all its pipelines; the
    others are dropped (no `local` plan). The search mixes depths by GPU type: only the
    candidates that can take a shared split count toward `limit`. (The user's cap on blocks
    needs no check here: `tables.max_stages` bounds every pipeline the search builds.)"""
    eligible = sorted((c for c in candidates if len(c.depths) == 1), key=lambda c: c.quick_s)
    out = []
    splits: dict[tuple[object, ...], list[int] | None] = {}  # placements of one plan repeat
    stage_costs: dict[tuple[object, ...], np.ndarray | None] = {}
    for candidate in eligible[:limit]:
        plan = candidate.plan
        shapes = _shapes(plan)
        key = (tuple(sorted(shapes.items())), len(plan.pipelines))
        if key not in splits:
            splits[key] = _common_split(tables, shapes, len(plan.pipelines), stage_costs)
        bounds = splits[key]
        if bounds is None:
            continue
        if bounds == _bounds(plan.pipelines[0]) and all(
                _bounds(p) == bounds for p in plan.pipelines):
            out.append(candidate)
            continue
        shared = plan.model_copy(update={"pipelines": [
            _with_bounds(p, bounds) for p in plan.pipelines]})
        out.append(Candidate.of(shared, quick_s=candidate.quick_s,
                                origin=f"{candidate.origin}, blocks shared by every pipeline"))
    return out


def _head_s(tables: ScenarioTables, key: tuple[str, int, int]) -> float | None:
    """Seconds of the local head's forward and backward at a (gpu_type, b, tp) point, None
    where it is not profiled (the stage cannot train through it)."""
    head = tables.scenario.job.local_head_kind
    if head is None:
        return 0.0
    row = profile_index(tables.scenario).get(key[0], head, key[1], key[2])
    return None if row is None else (row.forward_ms + row.backward_ms) * 1e-3


def _bounds(pipeline: Pipeline) -> list[int]:
    return [s.layers[0] for s in pipeline.stages] + [pipeline.stages[-1].layers[1]]


def _with_bounds(pipeline: Pipeline, bounds: list[int]) -> Pipeline:
    return pipeline.model_copy(update={"stages": [
        stage.model_copy(update={"single_range": (bounds[s], bounds[s + 1])})
        for s, stage in enumerate(pipeline.stages)]})


Shape = tuple[tuple[str, int, int], ...]
"""A pipeline's (gpu_type, micro_batch, tp) per stage."""


def _shapes(plan: Plan) -> dict[Shape, int]:
    """The plan's distinct pipeline shapes, each with its most micro-batches: replicas cost
    the same, and a replica with fewer micro-batches is never the slowest of its shape."""
    shapes: dict[Shape, int] = {}
    for p in plan.pipelines:
        key = tuple((s.gpu_type, p.micro_batch_size, s.tp) for s in p.stages)
        shapes[key] = max(shapes.get(key, 0), p.num_micro_batches)
    return shapes


def _common_split(tables: ScenarioTables, shapes: dict[Shape, int], num_pipelines: int,
                  stage_costs: dict[tuple[object, ...], np.ndarray | None]) -> list[int] | None:
    """Boundaries minimising the slowest (pipeline, stage) time, micro-batches counted, over
    splits where every pipeline's stages fit one micro-batch of activations (`local` keeps
    one in flight) and their state. None when no split fits. `stage_costs` memoises the
    cost matrices of one search's calls (most stages of most candidates repeat a few)."""
    num_layers = tables.num_layers
    depth = len(next(iter(shapes)))
    if depth > num_layers:
        return None
    per_param = state_bytes_per_param(tables.scenario, num_pipelines).total

    def one(key: tuple[str, int, int], m: int, last: bool) -> np.ndarray | None:
        """[a, e]: time of a stage at `key` over layers [a, e), inf where it does not fit."""
        memo = (key, m, last, per_param)
        if memo not in stage_costs:
            point = tables.points.get(key)
            head_s = 0.0 if last else _head_s(tables, key)
            if point is None or head_s is None:
                stage_costs[memo] = None
            else:
                time_s = m * (point.compute_s[None, :] - point.compute_s[:, None] + head_s)
                acts = point.activation_bytes[None, :] - point.activation_bytes[:, None]
                state = (tables.params[None, :] - tables.params[:, None]) / key[2] * per_param
                fits = (acts + state <= tables.capacity_bytes[key[0]]) & (
                    np.arange(num_layers + 1)[None, :] > np.arange(num_layers + 1)[:, None])
                stage_costs[memo] = np.where(fits, time_s, np.inf)
        return stage_costs[memo]

    def slowest(s: int) -> np.ndarray | None:
        """[a, e]: the slowest of the shapes' stage s over layers [a, e)."""
        column = tuple(sorted({(points[s], m) for points, m in shapes.items()}))
        memo = ("column", column, s == depth - 1, per_param)
        if memo not in stage_costs:
            matrices = [one(key, m, s == depth - 1) for key, m in column]
            stage_costs[memo] = None if any(x is None for x in matrices) else functools.reduce(
                np.maximum, matrices)  # type: ignore[arg-type]
        return stage_costs[memo]

    cost = []
    for s in range(depth):
        matrix = slowest(s)
        if matrix is None:
            return None
        cost.append(matrix)
    # best[s][e]: least bottleneck of stages 0..s covering [0, e).
    best = np.full((depth, num_layers + 1), np.inf)
    arg = np.zeros((depth, num_layers + 1), dtype=int)
    best[0] = cost[0][0]
    for s in range(1, depth):
        options = np.maximum(best[s - 1][:, None], cost[s])  # [a, e]
        arg[s] = np.argmin(options, axis=0)
        best[s] = options[arg[s], np.arange(num_layers + 1)]
    if not math.isfinite(best[depth - 1][num_layers]):
        return None
    bounds = [num_layers]
    for s in range(depth - 1, 0, -1):
        bounds.append(int(arg[s][bounds[-1]]))
    bounds.append(0)
    return bounds[::-1]


# --- interleaving and recomputation ------------------------------------------------------


Judged = tuple[Candidate, Evaluation]


def schedule_variants(
    scenario: Scenario,
    tables: ScenarioTables,
    bases: Sequence[Judged],
    allowed: Sequence[Schedule],
    *,
    recompute: bool,
    deadline: float,
) -> Judged | None:
    """The fastest valid plan among `bases` under an allowed schedule and their variants
    (see the module's docstring), judged by the estimator under `scenario`; None if none is
    valid. Variants stop being built at `deadline` (monotonic seconds), but not before a
    plan of an allowed schedule is found (an interleaved job's base plans are 1F1B)."""
    best: Judged | None = None
    seen: set[str] = set()

    def judge(plan: Plan, origin: str, sync_s: float) -> Judged | None:
        nonlocal best
        key = plan.model_dump_json()
        if key in seen:
            return None
        seen.add(key)
        # A variant whose floor (its busiest stage and the fill) and sync alone take longer
        # than the best plan cannot win, nor can its repair (recomputation lengthens
        # backwards, which only raises the floor).
        if _cannot_win(scenario, plan, sync_s, best):
            return None
        evaluation = evaluate(scenario, plan)
        if not evaluation.valid and recompute:
            # Recomputing lengthens backwards and changes nothing else: a plan over memory
            # that is already no faster than the best cannot win repaired.
            if best is not None and evaluation.iteration_s is not None and (
                    evaluation.iteration_s >= (best[1].iteration_s or math.inf)):
                return None
            repaired = _recompute_where_full(plan, evaluation)
            if repaired is not None:
                # The repair keeps every GPU's layers, so its rings: the sync just found.
                if _cannot_win(scenario, repaired, evaluation.sync_s or 0.0, best):
                    return None
                plan, origin = repaired, f"{origin}, recomputation where memory is full"
                evaluation = evaluate(scenario, plan)
        if not evaluation.valid or evaluation.iteration_s is None:
            return None
        judged = (Candidate.of(plan, quick_s=evaluation.iteration_s, origin=origin), evaluation)
        if best is None or evaluation.iteration_s < (best[1].iteration_s or math.inf):
            best = judged
        return judged

    for candidate, known in bases[:VARIANT_BASES]:
        seen.add(candidate.plan.model_dump_json())
        if (candidate.plan.schedule or scenario.job.schedule) in allowed and known.valid and (
                best is None or (known.iteration_s or math.inf)
                < (best[1].iteration_s or math.inf)):
            best = (candidate, known)
        for plan, origin in _variants(tables, candidate, allowed, recompute):
            if time.monotonic() > deadline and best is not None:
                return best
            judge(plan, origin, _known_sync_s(candidate.plan, known, plan))
    return best


def _cannot_win(scenario: Scenario, plan: Plan, sync_s: float, best: Judged | None) -> bool:
    """Whether the plan's iteration floor plus its sync (`sync_s` where known, else 0) already
    takes longer than the best plan: no simulation needed."""
    if best is None:
        return False
    floor = iteration_floor_s(scenario, plan)
    return floor is not None and floor + sync_s > (best[1].iteration_s or math.inf) * (
        1 + ROUNDING)


def _known_sync_s(base: Plan, known: Evaluation, variant: Plan) -> float:
    """The variant's sync where it is the base's: its stages are the base's own (a variant
    of another schedule or other micro-batches; sync depends only on the layers each GPU
    holds, and `local` is never a variant's schedule). 0 where not known."""
    if known.sync_s is None or len(variant.pipelines) != len(base.pipelines):
        return 0.0
    same = all(v.stages is b.stages for v, b in zip(variant.pipelines, base.pipelines,
                                                    strict=True))
    return known.sync_s if same else 0.0


def _variants(
    tables: ScenarioTables, candidate: Candidate, allowed: Sequence[Schedule], recompute: bool
) -> Iterator[tuple[Plan, str]]:
    """Plans to judge, from one base: cheap ones first."""
    plan = candidate.plan
    plain: list[Schedule] = [s for s in allowed if s is not Schedule.INTERLEAVED_1F1B]
    interleave = Schedule.INTERLEAVED_1F1B in allowed
    # The base under another allowed schedule; under interleaved-1f1b with v = 1 it runs
    # as 1F1B: worth judging only when the base's own schedule is not allowed.
    own = plan.schedule
    others: list[Schedule] = [s for s in plain if s is not own]
    if own not in allowed and interleave:
        others.append(Schedule.INTERLEAVED_1F1B)
    for schedule in others:
        yield plan.model_copy(update={"schedule": schedule}), _said(candidate.origin, schedule)
    if interleave:
        yield from _interleavings(tables, plan, candidate.origin)
    if recompute:
        yield from _recomputing(tables, plan, candidate.origin, plain, interleave)
    rounded = _micro_batches_for_interleaving(plan) if interleave else None
    if rounded is not None:
        yield from _interleavings(
            tables, rounded, f"{candidate.origin}, micro-batches rounded to the depth")


def _recomputing(
    tables: ScenarioTables, plan: Plan, origin: str, plain: list[Schedule], interleave: bool
) -> Iterator[tuple[Plan, str]]:
    """The plan with larger micro-batches (recomputation set where memory then runs out,
    when judged), under each allowed schedule and interleaved."""
    # Under interleaved-1f1b alone, a plan of v = 1 pipelines is judged as one.
    as_schedules: list[Schedule] = plain or [Schedule.INTERLEAVED_1F1B]
    for factor in MICRO_BATCH_FACTORS:
        larger = _larger_micro_batches(tables, plan, factor)
        if larger is None:
            continue
        said = f"{origin}, micro-batches x{factor} with recomputation"
        for schedule in as_schedules:
            yield larger.model_copy(update={"schedule": schedule}), said
        if interleave:
            yield from _interleavings(tables, larger, said)


def _interleavings(tables: ScenarioTables, plan: Plan, origin: str) -> Iterator[tuple[Plan, str]]:
    for v in range(2, MAX_VIRTUAL_STAGES + 1):
        interleaved = _interleaved(tables, plan, v)
        if interleaved is not None:
            yield interleaved, f"{origin}, interleaved with {v} chunks per stage"


def _said(origin: str, schedule: Schedule) -> str:
    return f"{origin}, schedule {schedule.value}"


def _recompute_where_full(plan: Plan, evaluation: Evaluation) -> Plan | None:
    """The plan with recomputation on every stage the estimator found over memory, when
    memory is all that is wrong (every error names a stage that does not fit)."""
    if not evaluation.pipelines:
        return None
    full = {(i, s) for i, p in enumerate(evaluation.pipelines)
            for s, stage in enumerate(p.stages) if not stage.fits}
    if not full or len(evaluation.errors) > len(full):
        return None
    if all(plan.pipelines[i].stages[s].recompute for i, s in full):
        return None
    return plan.model_copy(update={"pipelines": [
        pipeline.model_copy(update={"stages": [
            stage.model_copy(update={"recompute": True}) if (i, s) in full else stage
            for s, stage in enumerate(pipeline.stages)]})
        for i, pipeline in enumerate(plan.pipelines)]})


def _micro_batches_for_interleaving(plan: Plan) -> Plan | None:
    """The plan with every pipeline of two stages or more running a multiple of its depth
    in micro-batches (the nearest, at least the depth), so that it may interleave; the
    shallowest pipeline (fewest stages, then most micro-batches: its bubble weighs least)
    takes the samples the others gave up or gained, keeping one chunk if it must. None when
    nothing changes or the samples do not come out even."""
    pipelines = plan.pipelines
    sink = min(range(len(pipelines)),
               key=lambda i: (len(pipelines[i].stages), -pipelines[i].num_micro_batches))
    counts = [p.num_micro_batches for p in pipelines]
    freed = 0  # samples taken from the others, for the sink
    for i, pipeline in enumerate(pipelines):
        depth, m = len(pipeline.stages), pipeline.num_micro_batches
        if i == sink or depth < 2 or m % depth == 0:
            continue
        down = m - m % depth
        counts[i] = down if down and 2 * (m % depth) < depth else down + depth
        freed += (m - counts[i]) * pipeline.micro_batch_size
    b = pipelines[sink].micro_batch_size
    if freed == 0 or freed % b or counts[sink] + freed // b < 1:
        return None
    counts[sink] += freed // b
    return plan.model_copy(update={"pipelines": [
        p.model_copy(update={"num_micro_batches": m}) if m != p.num_micro_batches else p
        for p, m in zip(pipelines, counts, strict=True)]})


def _larger_micro_batches(tables: ScenarioTables, plan: Plan, factor: int) -> Plan | None:
    """Each pipeline whose micro-batch count divides by `factor` and whose stages are
    profiled at `factor` times its micro-batch size, with micro-batches that much larger and
    fewer (its samples unchanged); None when no pipeline can."""
    changed = False
    pipelines = []
    for pipeline in plan.pipelines:
        b = pipeline.micro_batch_size * factor
        if pipeline.num_micro_batches % factor == 0 and all(
                (s.gpu_type, b, s.tp) in tables.points for s in pipeline.stages):
            pipeline = pipeline.model_copy(update={
                "micro_batch_size": b, "num_micro_batches": pipeline.num_micro_batches // factor})
            changed = True
        pipelines.append(pipeline)
    return plan.model_copy(update={"pipelines": pipelines}) if changed else None


def _interleaved(tables: ScenarioTables, plan: Plan, v: int) -> Plan | None:
    """The plan under `interleaved-1f1b` with `v` chunks per stage in every pipeline that
    can take them (at least two stages, micro-batches a multiple of the depth, `v` layers
    per stage); None when no pipeline can."""
    changed = False
    pipelines = []
    for pipeline in plan.pipelines:
        chunked = _chunked(tables, pipeline, v)
        changed = changed or chunked is not None
        pipelines.append(chunked or pipeline)
    if not changed:
        return None
    return plan.model_copy(update={"schedule": Schedule.INTERLEAVED_1F1B, "pipelines": pipelines})


def _chunked(tables: ScenarioTables, pipeline: Pipeline, v: int) -> Pipeline | None:
    """Each stage keeps its share of the compute, cut into `v` chunks: model chunk
    `c = j * S + s` (chunk `j` of stage `s`) takes layers until it holds about `1 / v` of
    that stage's compute, timed on the stage's own GPUs."""
    stages = pipeline.stages
    depth = len(stages)
    if depth < 2 or pipeline.num_micro_batches % depth or any(
            s.layers[1] - s.layers[0] < v for s in stages):
        return None
    b = pipeline.micro_batch_size
    costs = [tables.points[(s.gpu_type, b, s.tp)].compute_s for s in stages]
    targets = [(c[s.layers[1]] - c[s.layers[0]]) / v for c, s in zip(costs, stages, strict=True)]
    num_layers, num_chunks = tables.num_layers, depth * v
    chunks: list[list[tuple[int, int]]] = [[] for _ in stages]
    start = 0
    for c in range(num_chunks):
        s = c % depth
        left = num_chunks - c - 1  # chunks after this one, each needing a layer
        if left == 0:
            end = num_layers
        else:
            prefix = costs[s]
            want = prefix[start] + targets[s]
            end = int(np.searchsorted(prefix, want))
            if end > start + 1 and want - prefix[end - 1] < prefix[min(end, num_layers)] - want:
                end -= 1  # the nearer of the two cuts around the target
            end = min(max(end, start + 1), num_layers - left)
        chunks[s].append((start, end))
        start = end
    return pipeline.model_copy(update={"stages": [
        Stage(gpu_type=stage.gpu_type, tp=stage.tp, gpus=list(stage.gpus), chunks=ranges,
              recompute=stage.recompute)
        for stage, ranges in zip(stages, chunks, strict=True)]})
