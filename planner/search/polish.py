"""The best plan polished by local moves, each judged by the event simulation.

The templates' splits minimise the bottleneck stage, which sets a pipeline's
time once it runs many micro-batches. The fill, and where a node crossing's
blocking transfers land, weigh too: among splits of nearly equal bottleneck
the simulation can tell a faster one (a heavy stage last rather than in the
middle, a boundary that moves a layer off a stage whose sync ring is the
longest). A template's micro-batch size is chosen with the template's own
split, while the split found may fit a larger one. And two neighbouring stages
on one node may run faster as one stage of twice the tp (no transfer between
them, one stage less to fill). So each pipeline shape (all replicas of it at
once) tries its micro-batch size doubled or halved (the pipeline's samples
unchanged) and each boundary between two stages moved by one layer, those that
relieve the heaviest stages first; then merges of neighbouring stages. A move
is kept when the reference estimator finds the plan faster, with the batch shares it had
or, where it made some pipeline faster but not the plan, with least-time shares (one more
try: the others must give up samples before a faster shape shortens the iteration). Each
try is a full evaluation, whose cost grows with the plan's stages and with the
micro-batches of the shape a move changes: larger plans get fewer tries, and plans past
MAX_GPUS none.
"""

from __future__ import annotations

import functools
import itertools
import math
import time
from collections.abc import Callable, Iterator

from planner.costs import NodeIndex, node_index
from planner.documents import Pipeline, Plan, Scenario, Schedule, Stage
from planner.estimate import Evaluation, evaluate, overflows_memory
from planner.search.refine import rebalance

__all__ = ["polish_plan", "tries_per_phase"]

MAX_GPUS = 1024
"""Plans on more GPUs are left as they are: there a try evaluates for tenths of a second,
and on the scaled inputs of bench/plan_time.py no try found a faster plan."""
MAX_TRIES = 64  # evaluations one polish may spend
PIPELINE_EVALUATIONS = 640
STAGE_EVALUATIONS = 5000
"""Tries times what one costs, in pipelines and in stages (simulated operations counted in
stages too), per phase: larger plans get fewer tries (at least MIN_TRIES), the tighter
measure setting the count, counted rather than timed so that a plan does not depend on how
busy the machine was. Pipelines alone undercount deep pipelines of many micro-batches: a
plan of eight 36-stage pipelines of 192 micro-batches got 64 tries of 9 ms each."""
SIMULATED_PER_STAGE = 60
"""An evaluation costs about 20 us per stage of the plan (validity, memory, rings) and
0.3 us per (stage, micro-batch) of a shape it simulates: one stage for every this many
(measured on the best plans of the shared and scaled scenarios, BENCHMARKS 3)."""
MIN_TRIES = 4


def polish_plan(
    scenario: Scenario, plan_doc: Plan, evaluation: Evaluation, *, deadline: float = math.inf
) -> tuple[Plan, Evaluation] | None:
    """A faster plan reached by moves of the module's docstring, or None. No try starts
    after `deadline` (time.monotonic()): a guard for slow machines, not the budget."""
    num_gpus = sum(len(stage.gpus) for pipeline in plan_doc.pipelines for stage in pipeline.stages)
    if num_gpus > MAX_GPUS or evaluation.iteration_s is None:
        return None
    if evaluation.schedule == Schedule.LOCAL.value:
        return None  # under local learning every pipeline keeps the same blocks
    points = {(row.gpu_type, row.micro_batch, row.tp) for row in scenario.profiles}
    nodes = node_index(scenario)
    most = tries_per_phase(plan_doc)
    best, best_eval = plan_doc, evaluation
    # Merges come last, from the split the other moves settled on: taken first, a merge's
    # immediate gain led the 512-GPU GPT-Neo plan to a worse end (156.4 against 157.9).
    phases: list[Callable[[Plan, Evaluation], Iterator[Move]]] = [
        lambda p, e: itertools.chain(_micro_batch_moves(p, points), _boundary_moves(p, e)),
        lambda p, _: _merge_moves(p, points, nodes)]
    for moves in phases:
        best, best_eval = _climb(scenario, best, best_eval, moves, most, deadline)
    return None if best is plan_doc else (best, best_eval)


def tries_per_phase(plan_doc: Plan) -> int:
    """Evaluations each phase may spend on this plan: fewer the more a try costs."""
    return min(MAX_TRIES, max(MIN_TRIES, min(PIPELINE_EVALUATIONS // len(plan_doc.pipelines),
                                             STAGE_EVALUATIONS // _stages_per_try(plan_doc))))


def _stages_per_try(plan_doc: Plan) -> int:
    """What one try costs, in stages evaluated: every stage of the plan, and the operations
    of the shape a move changes (the estimator simulates each distinct shape once and keeps
    the times of those it has seen), counted at the largest shape."""
    stages = sum(len(pipeline.stages) for pipeline in plan_doc.pipelines)
    simulated = max(len(pipeline.stages) * pipeline.num_micro_batches
                    for pipeline in plan_doc.pipelines)
    return max(1, stages + simulated // SIMULATED_PER_STAGE)


def _climb(scenario: Scenario, best: Plan, best_eval: Evaluation,
           moves: Callable[[Plan, Evaluation], Iterator[Move]], most: int, deadline: float
           ) -> tuple[Plan, Evaluation]:
    """First improvement: the first of `moves` the estimator finds faster is kept and the
    moves start again from it, at most `most` tries. A move that overflows memory on a
    pipeline it changed is invalid, so neither faster nor a pipeline sped up: it spends its
    try without a full evaluation (most boundary moves on memory-bound plans)."""
    tries = 0
    improved = True
    while improved and tries < most:
        improved = False
        to_beat = (best_eval.iteration_s or math.inf) * (1 - 1e-9)
        for moved, changed in moves(best, best_eval):
            if time.monotonic() > deadline or tries >= most:
                break
            tries += 1
            if overflows_memory(scenario, moved, changed):
                continue
            trial = evaluate(scenario, moved)
            if not _faster(trial, to_beat) and tries < most and _sped_up(trial, best_eval):
                # Shares balance the pipelines' times: a move that speeds one shape up
                # shortens the iteration only once the others take fewer samples.
                balanced = rebalance(scenario, moved, trial)
                if balanced is not None:
                    tries += 1
                    moved, trial = balanced, evaluate(scenario, balanced)
            if _faster(trial, to_beat):
                best, best_eval, improved = moved, trial, True
                break
    return best, best_eval


def _faster(trial: Evaluation, to_beat: float) -> bool:
    return trial.valid and trial.iteration_s is not None and trial.iteration_s < to_beat


def _sped_up(trial: Evaluation, before: Evaluation) -> bool:
    """Whether a valid trial made some pipeline faster (moves keep the pipelines' order)."""
    return trial.valid and len(trial.pipelines) == len(before.pipelines) and any(
        after.T_p < earlier.T_p * (1 - 1e-9)
        for after, earlier in zip(trial.pipelines, before.pipelines, strict=True))


def _shapes(plan_doc: Plan) -> list[list[int]]:
    """Indices of the pipelines of each shape (micro-batch size, stage types, tp, layers)."""
    shapes: dict[tuple[object, ...], list[int]] = {}
    for p, pipeline in enumerate(plan_doc.pipelines):
        key = (pipeline.micro_batch_size,
               tuple((s.gpu_type, s.tp, tuple(s.layers)) for s in pipeline.stages))
        shapes.setdefault(key, []).append(p)
    return list(shapes.values())


Move = tuple[Plan, list[int]]
"""A moved plan and the pipelines the move changed."""


def _micro_batch_moves(plan_doc: Plan, points: set[tuple[str, int, int]]) -> Iterator[Move]:
    """Every plan with one shape's micro-batches twice or half as large and half or twice as
    many, where every stage is profiled at the new size."""
    for members in _shapes(plan_doc):
        pipeline = plan_doc.pipelines[members[0]]
        b, m = pipeline.micro_batch_size, pipeline.num_micro_batches
        for size, count in ((2 * b, m // 2), (b // 2, 2 * m)):
            if size * count == b * m and size >= 1 and all(
                    (s.gpu_type, size, s.tp) in points for s in pipeline.stages):
                yield _with_shape(plan_doc, members,
                                  functools.partial(_resized, size=size, count=count)), members


def _merge_moves(plan_doc: Plan, points: set[tuple[str, int, int]], nodes: NodeIndex
                 ) -> Iterator[Move]:
    """Every plan with two neighbouring stages of one shape, of one type and tp and on one
    node in every replica, run as one stage of twice the tp: one transfer fewer per
    micro-batch, one stage less to fill, each GPU holding about the same parameters."""
    for members in _shapes(plan_doc):
        pipeline = plan_doc.pipelines[members[0]]
        b = pipeline.micro_batch_size
        for s, (front, back) in enumerate(itertools.pairwise(pipeline.stages)):
            if (front.gpu_type != back.gpu_type or front.tp != back.tp
                    or (front.gpu_type, b, 2 * front.tp) not in points):
                continue
            if any(_node(nodes, plan_doc.pipelines[i].stages[s])
                   != _node(nodes, plan_doc.pipelines[i].stages[s + 1]) for i in members):
                continue
            yield _with_shape(plan_doc, members, functools.partial(_merged, s=s)), members


def _node(nodes: NodeIndex, stage: Stage) -> str:
    located = nodes.locate(stage.gpus[0])
    assert located is not None, "the plan was evaluated valid"
    return located[0].name


def _merged(pipeline: Pipeline, s: int) -> Pipeline:
    stages = list(pipeline.stages)
    front, back = stages[s], stages[s + 1]
    stages[s:s + 2] = [Stage.model_construct(
        gpu_type=front.gpu_type, tp=2 * front.tp, gpus=[*front.gpus, *back.gpus],
        layers=(front.layers[0], back.layers[1]))]
    return _pipeline(pipeline, stages)


def _boundary_moves(plan_doc: Plan, evaluation: Evaluation) -> Iterator[Move]:
    """Every plan that moves one boundary of one pipeline shape by one layer, those that
    take the most off a heavier stage (compute and sync) first: tries run out on large
    plans."""
    moves: list[tuple[float, int, list[int], int, int]] = []
    for members in _shapes(plan_doc):
        stages = plan_doc.pipelines[members[0]].stages
        estimate = evaluation.pipelines[members[0]]
        # What a stage would cost the iteration were it the bottleneck: all its micro-
        # batches, then its sync ring.
        load = [estimate.num_micro_batches * (s.effective_forward_ms + s.effective_backward_ms)
                * 1e-3 + s.sync_s for s in estimate.stages]
        for s in range(len(stages) - 1):
            for step, relief in ((-1, load[s] - load[s + 1]), (1, load[s + 1] - load[s])):
                boundary = stages[s].layers[1] + step
                if stages[s].layers[0] < boundary < stages[s + 1].layers[1]:
                    moves.append((-relief, len(moves), members, s, boundary))
    for *_, members, s, boundary in sorted(moves):
        yield _with_boundary(plan_doc, members, s, boundary), members


def _with_boundary(plan_doc: Plan, members: list[int], s: int, boundary: int) -> Plan:
    def moved(pipeline: Pipeline) -> Pipeline:
        stages = list(pipeline.stages)
        front, back = stages[s], stages[s + 1]
        stages[s] = Stage.model_construct(gpu_type=front.gpu_type, tp=front.tp,
                                          gpus=front.gpus, layers=(front.layers[0], boundary))
        stages[s + 1] = Stage.model_construct(gpu_type=back.gpu_type, tp=back.tp,
                                              gpus=back.gpus, layers=(boundary, back.layers[1]))
        return _pipeline(pipeline, stages)

    return _with_shape(plan_doc, members, moved)


def _with_shape(plan_doc: Plan, members: list[int], change: Callable[[Pipeline], Pipeline]
                ) -> Plan:
    """The plan with `change` made to every pipeline of a shape (`members`)."""
    chosen = set(members)
    return plan_doc.model_copy(update={"pipelines": [
        change(pipeline) if p in chosen else pipeline
        for p, pipeline in enumerate(plan_doc.pipelines)]})


def _pipeline(pipeline: Pipeline, stages: list[Stage]) -> Pipeline:
    """`pipeline` with other stages, unvalidated: moves are judged by the estimator, which
    validates."""
    return Pipeline.model_construct(micro_batch_size=pipeline.micro_batch_size,
                                    num_micro_batches=pipeline.num_micro_batches, stages=stages)


def _resized(pipeline: Pipeline, *, size: int, count: int) -> Pipeline:
    return Pipeline.model_construct(micro_batch_size=size, num_micro_batches=count,
                                    stages=pipeline.stages)
