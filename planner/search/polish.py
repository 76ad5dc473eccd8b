"""Layer splits polished by the event simulation.

The templates' splits minimise the bottleneck stage, which sets a pipeline's
time once it runs many micro-batches. The fill, and where a node crossing's
blocking transfers land, weigh too: among splits of nearly equal bottleneck
the simulation can tell a faster one (a heavy stage last rather than in the
middle, a boundary that moves a layer off a stage that also sends between
nodes). Here each boundary between two stages is moved by one layer, in every
replica of a pipeline shape at once, and a move is kept when the reference
estimator finds the plan faster. Each try is a full evaluation, whose cost
grows with the plan: the polish stops at a deadline the caller sets.
"""

from __future__ import annotations

import math
import time

from planner.documents import Pipeline, Plan, Scenario, Stage
from planner.estimate import Evaluation, evaluate

__all__ = ["polish_splits"]

MAX_TRIES = 64  # evaluations one polish may spend


def polish_splits(
    scenario: Scenario, plan_doc: Plan, evaluation: Evaluation, *, deadline: float = math.inf
) -> tuple[Plan, Evaluation] | None:
    """A faster plan with some stage boundaries moved by one layer, or None. No try starts
    after `deadline` (time.monotonic())."""
    if evaluation.iteration_s is None:
        return None
    best, best_eval = plan_doc, evaluation
    tries = 0
    improved = True
    while improved and tries < MAX_TRIES:
        improved = False
        for moved in _single_moves(best):
            if time.monotonic() > deadline:
                break
            tries += 1
            trial = evaluate(scenario, moved)
            if (trial.valid and trial.iteration_s is not None and best_eval.iteration_s is not None
                    and trial.iteration_s < best_eval.iteration_s * (1 - 1e-9)):
                best, best_eval, improved = moved, trial, True
                break
            if tries >= MAX_TRIES:
                break
    return None if best is plan_doc else (best, best_eval)


def _single_moves(plan_doc: Plan) -> list[Plan]:
    """Every plan that moves one boundary of one pipeline shape by one layer."""
    shapes: dict[tuple[object, ...], list[int]] = {}
    for p, pipeline in enumerate(plan_doc.pipelines):
        key = (pipeline.micro_batch_size,
               tuple((s.gpu_type, s.tp, tuple(s.layers)) for s in pipeline.stages))
        shapes.setdefault(key, []).append(p)
    moves = []
    for members in shapes.values():
        stages = plan_doc.pipelines[members[0]].stages
        for s in range(len(stages) - 1):
            for step in (-1, 1):
                boundary = stages[s].layers[1] + step
                if stages[s].layers[0] < boundary < stages[s + 1].layers[1]:
                    moves.append(_with_boundary(plan_doc, members, s, boundary))
    return moves


def _with_boundary(plan_doc: Plan, members: list[int], s: int, boundary: int) -> Plan:
    chosen = set(members)
    pipelines = []
    for p, pipeline in enumerate(plan_doc.pipelines):
        if p in chosen:
            stages = list(pipeline.stages)
            front, back = stages[s], stages[s + 1]
            stages[s] = Stage.model_construct(gpu_type=front.gpu_type, tp=front.tp,
                                              gpus=front.gpus, layers=(front.layers[0], boundary))
            stages[s + 1] = Stage.model_construct(gpu_type=back.gpu_type, tp=back.tp,
                                                  gpus=back.gpus, layers=(boundary, back.layers[1]))
            pipeline = Pipeline.model_construct(micro_batch_size=pipeline.micro_batch_size,
                                                num_micro_batches=pipeline.num_micro_batches,
                                                stages=stages)
        pipelines.append(pipeline)
    return plan_doc.model_copy(update={"pipelines": pipelines})
