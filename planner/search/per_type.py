"""The per-type space: homogeneous pipelines of each class, side by side.

What a careful engineer builds by hand: for every class (a GPU type in a
zone), pipelines of one depth, tp and micro-batch size with the least-
bottleneck layer split, as many replicas as fit, the classes run as data-
parallel replicas of one another with the batch split by speed. Every depth
is offered, not only those that cut the bottleneck: a deeper pipeline puts
fewer parameters on each GPU, so it syncs less.

Choosing one option per class is a trade between throughput and the sync
ring, whose time is set by the heaviest stage of any class. For each sync
threshold, every class takes the option (or none) that covers the most
samples by the least time at which the chosen set covers the batch (found by
bisection); the thresholds sweep the trade from the cheapest sync to none.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from planner.search.tables import ResourceClass, ScenarioTables
from planner.search.templates import PipelineTemplate, TemplateContext, homogeneous_templates

__all__ = ["ClassOption", "class_options", "per_type_choices"]

NUM_THRESHOLDS = 96
"""Sync thresholds swept (quantiles of the options' sync times, all of them when fewer)."""
BISECTIONS = 40


def heaviest_gradient(template: PipelineTemplate, params: Sequence[float]) -> float:
    """Parameters per GPU of the template's heaviest stage (`params`: prefix sums over
    layers): what its sync ring carries."""
    bounds = template.partition.bounds
    return max((params[end] - params[start]) / shape.tp
               for start, end, shape in zip(bounds[:-1], bounds[1:], template.stages, strict=True))


@dataclass(frozen=True, kw_only=True, eq=False)
class ClassOption:
    """`copies` pipelines of one homogeneous template."""

    template: PipelineTemplate
    copies: int

    @property
    def slope(self) -> float:
        """Samples per second, once every copy's pipeline is full."""
        return self.copies * self.template.micro_batch / self.template.bottleneck_s

    @property
    def intercept(self) -> float:
        t = self.template
        return self.copies * t.micro_batch * (1.0 - t.fill_s / t.bottleneck_s)


def class_options(
    ctx: TemplateContext, cls: ResourceClass, *, num_pipelines: int = 1
) -> list[ClassOption]:
    """Every depth and profiled point of the class, with all its replicas, half and a quarter
    of them (fewer GPUs on a node share its network interfaces among fewer rings)."""
    options = []
    for template in homogeneous_templates(ctx, cls, num_pipelines=num_pipelines, every_depth=True):
        most = cls.slots(template.stages[0].tp) // template.num_stages
        for copies in sorted({most, -(-most // 2), -(-most // 4)}, reverse=True):
            if copies > 0:
                options.append(ClassOption(template=template, copies=copies))
    return options


def per_type_choices(
    tables: ScenarioTables, options: Sequence[Sequence[ClassOption]]
) -> Iterator[tuple[ClassOption, ...]]:
    """Sets of at most one option per class worth judging, each once."""
    batch = tables.scenario.job.global_batch_size
    params = tables.params.tolist()
    arrays = [_Options(group, params) for group in options if group]
    keys = np.unique(np.concatenate([a.sync for a in arrays])) if arrays else np.array([])
    if len(keys) > NUM_THRESHOLDS:
        keys = np.quantile(keys, np.linspace(0.0, 1.0, NUM_THRESHOLDS), method="higher")
    seen: set[tuple[int, ...]] = set()
    for threshold in keys:
        chosen = _least_time(arrays, float(threshold), batch)
        # Dropping one class also shortens every ring its stages were on.
        for variant in [chosen, *(chosen[:i] + chosen[i + 1:] for i in range(len(chosen)))]:
            key = tuple(sorted(id(o) for o in variant))
            if variant and key not in seen:
                seen.add(key)
                yield variant


class _Options:
    """One class's options as arrays."""

    def __init__(self, group: Sequence[ClassOption], params: Sequence[float]) -> None:
        self.options = list(group)
        self.slope = np.array([o.slope for o in group])
        self.intercept = np.array([o.intercept for o in group])
        self.fill = np.array([o.template.fill_s for o in group])
        # Compared across classes in bytes, not seconds: a combined ring runs at its
        # slowest member's link, whichever class a stage belongs to.
        self.sync = np.array([heaviest_gradient(o.template, params) for o in group])


def _best_at(arrays: Sequence[_Options], threshold: float, target: float) -> tuple[ClassOption, ...]:
    """Per class, the option under the sync threshold that covers the most samples by
    `target` (none where no option covers any)."""
    picks = []
    for a in arrays:
        covered = np.where((a.sync <= threshold) & (a.fill <= target),
                           a.slope * target + a.intercept, -np.inf)
        best = int(covered.argmax())
        if covered[best] > 0:
            picks.append(a.options[best])
    return tuple(picks)


def _least_time(arrays: Sequence[_Options], threshold: float, batch: int) -> tuple[ClassOption, ...]:
    """The options that cover the batch soonest under the threshold: the samples the best
    options cover grow with time, so the least time that covers the batch is bisected."""
    low, high = 0.0, 1.0
    while sum(o.slope * high + o.intercept for o in _best_at(arrays, threshold, high)) < batch:
        high *= 2
        if high > 1e9:
            return ()
    for _ in range(BISECTIONS):
        middle = (low + high) / 2
        covered = sum(o.slope * middle + o.intercept for o in _best_at(arrays, threshold, middle))
        low, high = (low, middle) if covered >= batch else (middle, high)
    return _best_at(arrays, threshold, high)


