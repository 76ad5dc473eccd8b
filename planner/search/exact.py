"""Exact mode: every plan of a small scenario, judged by the reference estimator.

The version-1 space is enumerated whole: ordered sets of pipelines, each an
ordered list of stages (a node and a profiled tp), every contiguous layer
split, every profiled micro-batch size and every batch share. GPUs of one
node are interchangeable, so each stage takes the lowest free indices. The
result is the proven optimum; the enumeration is refused beyond `MAX_PLANS`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from planner.documents import Node, Pipeline, Plan, Scenario, Stage
from planner.errors import PlannerError
from planner.estimate import Evaluation, evaluate

__all__ = ["MAX_PLANS", "TooLargeForExact", "exact_optimum"]

MAX_PLANS = 200_000


class TooLargeForExact(PlannerError):
    pass


def exact_optimum(scenario: Scenario) -> tuple[Plan, Evaluation, int] | None:
    """(best plan, its evaluation, plans judged), or None if no plan is valid."""
    shapes = list(_pipeline_shapes(scenario))
    # Count first (cheap), so that a scenario too large is refused before any judging.
    count = sum(1 for _ in itertools.islice(_plans(scenario, shapes), MAX_PLANS + 1))
    if count > MAX_PLANS:
        raise TooLargeForExact(
            f"exact mode judges at most {MAX_PLANS} plans and this scenario has more; "
            "use the default search, or fewer GPUs, layers or profiled points")
    best: tuple[Plan, Evaluation] | None = None
    types = {n.name: n.gpu_type for n in scenario.cluster.nodes}
    for chosen, splits, shares in _plans(scenario, shapes):
        plan_doc = _plan_document(types, chosen, splits, shares)
        evaluation = evaluate(scenario, plan_doc)
        if not evaluation.valid or evaluation.iteration_s is None:
            continue
        if best is None or evaluation.iteration_s < (best[1].iteration_s or float("inf")):
            best = (plan_doc, evaluation)
    return None if best is None else (best[0], best[1], count)


def _points(scenario: Scenario) -> dict[str, set[tuple[int, int]]]:
    """Per GPU type, the (micro_batch, tp) points profiled for every kind of the model."""
    kinds = set(scenario.model.layers)
    have: dict[tuple[str, int, int], set[str]] = {}
    for row in scenario.profiles:
        have.setdefault((row.gpu_type, row.micro_batch, row.tp), set()).add(row.kind)
    out: dict[str, set[tuple[int, int]]] = {}
    for (gpu_type, b, tp), profiled in have.items():
        if kinds <= profiled:
            out.setdefault(gpu_type, set()).add((b, tp))
    return out


def _pipeline_shapes(scenario: Scenario) -> Iterator[tuple[tuple[tuple[str, int], ...], int]]:
    """Every (stage sequence of (node, tp), micro-batch) whose stages could all exist."""
    points = _points(scenario)
    nodes = scenario.cluster.nodes
    sizes = sorted({b for p in points.values() for b, _ in p})
    num_layers = len(scenario.model.layers)
    total = sum(n.gpus for n in nodes)
    for b in sizes:
        options = [(n.name, tp) for n in nodes for (bb, tp) in sorted(points.get(n.gpu_type, ()))
                   if bb == b and tp <= n.gpus]
        for depth in range(1, min(num_layers, total) + 1):
            for stages in itertools.product(options, repeat=depth):
                if _fits(nodes, [stages]):
                    yield stages, b


def _fits(nodes: list[Node], pipelines: list[tuple[tuple[str, int], ...]]) -> bool:
    used: dict[str, int] = {}
    for stages in pipelines:
        for name, tp in stages:
            used[name] = used.get(name, 0) + tp
    return all(used.get(n.name, 0) <= n.gpus for n in nodes)


PipelineShape = tuple[tuple[tuple[str, int], ...], int]
"""(stages as (node, tp), micro-batch size)"""


def _plans(
    scenario: Scenario, shapes: list[PipelineShape]
) -> Iterator[tuple[tuple[PipelineShape, ...], tuple[tuple[int, ...], ...], tuple[int, ...]]]:
    """(pipelines, layer bounds of each, micro-batches of each) of every plan."""
    nodes = scenario.cluster.nodes
    batch = scenario.job.global_batch_size
    num_layers = len(scenario.model.layers)
    for n in range(1, len(shapes) + 1):
        found_any = False
        for chosen in itertools.product(shapes, repeat=n):
            if sum(b for _, b in chosen) > batch or not _fits(nodes, [s for s, _ in chosen]):
                continue
            found_any = True
            for splits in itertools.product(*[_splits(num_layers, len(s)) for s, _ in chosen]):
                for shares in _shares([b for _, b in chosen], batch):
                    yield chosen, splits, shares
        if not found_any:
            return


def _splits(num_layers: int, depth: int) -> list[tuple[int, ...]]:
    return [(0, *cuts, num_layers) for cuts in itertools.combinations(range(1, num_layers), depth - 1)]


def _shares(sizes: list[int], batch: int) -> Iterator[tuple[int, ...]]:
    """Micro-batch counts of at least 1 with sum(b * m) == batch."""
    if len(sizes) == 1:
        if batch % sizes[0] == 0 and batch >= sizes[0]:
            yield (batch // sizes[0],)
        return
    head, rest = sizes[0], sizes[1:]
    for m in range(1, (batch - sum(rest)) // head + 1):
        for tail in _shares(rest, batch - head * m):
            yield (m, *tail)


def _plan_document(
    types: dict[str, str],
    chosen: tuple[PipelineShape, ...],
    splits: tuple[tuple[int, ...], ...],
    shares: tuple[int, ...],
) -> Plan:
    next_free: dict[str, int] = {}
    pipelines = []
    for (stages, b), bounds, m in zip(chosen, splits, shares, strict=True):
        built = []
        for s, (node, tp) in enumerate(stages):
            start = next_free.get(node, 0)
            next_free[node] = start + tp
            built.append(Stage(gpu_type=types[node], tp=tp,
                               gpus=[f"{node}:{i}" for i in range(start, start + tp)],
                               layers=(bounds[s], bounds[s + 1])))
        pipelines.append(Pipeline(micro_batch_size=b, num_micro_batches=m, stages=built))
    return Plan(pipelines=pipelines)
