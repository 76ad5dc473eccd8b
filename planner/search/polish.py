"""Layer splits polished by the event simulation, for small plans.

The templates' splits minimise the bottleneck stage, which sets a pipeline's
time once it runs many micro-batches. With few micro-batches the fill weighs
as much, and among splits of equal bottleneck the simulation can tell a faster
one (a heavy stage last rather than in the middle, say). Here each boundary
between two stages is moved by one layer, in every replica of a pipeline
shape at once, and a move is kept when the reference estimator finds the plan
faster. Each try is a full evaluation, so only small plans are polished, and
only pipeline shapes run with few micro-batches (where the fill counts).
"""

from __future__ import annotations

from planner.documents import Pipeline, Plan, Scenario, Stage
from planner.estimate import Evaluation, evaluate

__all__ = ["polish_splits"]

MAX_GPUS = 64
"""Plans on more GPUs are left as they are: each try evaluates the whole plan."""
FEW_MICRO_BATCHES = 2
"""Shapes run with more than this many micro-batches per stage are left as they are: the
bottleneck, which the templates already minimise, is then what counts."""
MAX_TRIES = 64  # evaluations one polish may spend


def polish_splits(
    scenario: Scenario, plan_doc: Plan, evaluation: Evaluation
) -> tuple[Plan, Evaluation] | None:
    """A faster plan with some stage boundaries moved by one layer, or None."""
    num_gpus = sum(len(stage.gpus) for pipeline in plan_doc.pipelines for stage in pipeline.stages)
    if num_gpus > MAX_GPUS or evaluation.iteration_s is None:
        return None
    best, best_eval = plan_doc, evaluation
    tries = 0
    improved = True
    while improved and tries < MAX_TRIES:
        improved = False
        for moved in _single_moves(best):
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
        pipeline = plan_doc.pipelines[members[0]]
        stages = pipeline.stages
        if pipeline.num_micro_batches > FEW_MICRO_BATCHES * len(stages):
            continue
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
