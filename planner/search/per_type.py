"""The per-type space: homogeneous pipelines of each class, side by side.

What a careful engineer builds by hand: for every class (a GPU type in a
zone), pipelines of one depth, tp and micro-batch size with the least-
bottleneck layer split, some number of replicas, the classes run as data-
parallel replicas of one another with the batch split by speed. Every depth
is offered, not only those that cut the bottleneck: a deeper pipeline puts
fewer parameters on each GPU, so it syncs less.

Choosing one option per class (or none) trades throughput against the sync
ring, whose time is set by the heaviest stage of any class, the slowest link
among the classes and the number of pipelines. Two steps find the sets worth
judging:
1. For each threshold on the heaviest stage's parameters per GPU, every class
   takes the option under it that covers the most samples by the least time
   at which the chosen set covers the batch (bisected: coverage grows with
   time), counting whole micro-batches.
2. From each of those sets, coordinate descent: one class at a time moves to
   the option (or none) of least estimated iteration time (that least time
   plus the sync ring's estimate), until no class moves.
Options are timed as their copies will be placed: node after node, at the worst
start in a node any of them gets (`_straddle_s`); a node each, where each fits one
(`_aligned_shares`); and, where their stages tile a node side by side, also
stage-major, rings inside nodes and transfers between them (`_stage_major_s`).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from planner.costs import zone_link
from planner.search.partition import fixed_partition
from planner.search.tables import ResourceClass, ScenarioTables
from planner.search.templates import (
    PipelineTemplate,
    TemplateContext,
    homogeneous_templates,
    stages_per_node,
)

__all__ = ["ClassOption", "PerTypeSet", "class_options", "per_type_choices"]

NUM_THRESHOLDS = 16
"""Thresholds swept (quantiles of the options' heaviest stages, all of them when fewer)."""
BISECTIONS = 20
DESCENT_ROUNDS = 4
DESCENT_STARTS = 6
"""Sets of least estimated time, from the threshold sweep, that descent starts from."""
SHARDED_OVER = 8
"""Under ZeRO, templates are also sized for this many pipelines sharing optimizer state."""


@dataclass(frozen=True, kw_only=True, eq=False)
class ClassOption:
    """`copies` pipelines of one homogeneous template."""

    template: PipelineTemplate
    copies: int
    min_pipelines: int = 1
    """The fewest pipelines over which the template's state must be sharded (ZeRO) for it to
    fit: valid only in plans of at least as many."""


def class_options(ctx: TemplateContext, cls: ResourceClass) -> list[ClassOption]:
    """Every depth and profiled point of the class, with all its replicas, half and a quarter
    of them (fewer GPUs on a node share its network interfaces among fewer rings). Under
    ZeRO, state sharded over eight pipelines fits deeper into memory: such templates are
    offered too, valid only in plans of as many pipelines as their split needs to fit."""
    options = []
    sharded = ctx.scenario.job.zero_stage >= 1
    for hint in (1, SHARDED_OVER) if sharded else (1,):
        for template in homogeneous_templates(ctx, cls, num_pipelines=hint):
            least = 1 if hint == 1 else fewest_sharing(ctx, template, hint)
            most = cls.slots(template.stages[0].tp) // template.num_stages
            for copies in sorted({most, -(-most // 2), -(-most // 4)}, reverse=True):
                if copies > 0:
                    options.append(ClassOption(template=template, copies=copies,
                                               min_pipelines=least))
    return options


def fewest_sharing(ctx: TemplateContext, template: PipelineTemplate, most: int) -> int:
    """The fewest pipelines (at most `most`, for which the split was sized) whose ZeRO
    sharding lets every stage of `template` fit, by section 4's memory: a split sized for
    eight pipelines often fits among two or three, and a set of fewer was refused it."""
    depth, b = template.num_stages, template.micro_batch
    # Links only price transfers, not memory: none given.
    specs = [ctx.stage_spec(shape, b, depth - s, None)
             for s, shape in enumerate(template.stages)][::-1]
    bounds = list(template.partition.bounds)
    for n in range(1, most):
        if fixed_partition(ctx.tables, specs, bounds, blocking=False,
                           num_pipelines=n) is not None:
            return n
    return most


class PerTypeSet(NamedTuple):
    """At most one option per class, and the sync the choice estimated for it (with copies
    that fit a node each placed node-aligned, which a draft's rough sync does not see)."""

    picks: tuple[ClassOption, ...]
    sync_s: float


def per_type_choices(
    tables: ScenarioTables, options: Sequence[Sequence[ClassOption]]
) -> Iterator[PerTypeSet]:
    """Sets of at most one option per class worth judging, each once."""
    batch = tables.scenario.job.global_batch_size
    groups = [_ClassArrays(tables, group) for group in options if group]
    if not groups:
        return
    keys = np.unique(np.concatenate([g.heaviest for g in groups]))
    if len(keys) > NUM_THRESHOLDS:
        keys = np.quantile(keys, np.linspace(0.0, 1.0, NUM_THRESHOLDS), method="higher")
    sweep = {c: c for c in _under_thresholds(groups, keys, batch)}
    ring = _Ring(tables, groups)
    scored = sorted((ring.iteration_s(groups, c, batch), k) for k, c in sweep.items() if c)
    found = dict(sweep)
    for _, key in scored[:DESCENT_STARTS]:
        for step in _descent(groups, ring, sweep[key], batch):
            found.setdefault(step, step)
    # Two rows of one option (a copy at a time, stage-major) give the same picks: each set
    # once, as the row of least estimated time places it.
    by_picks: dict[tuple[int, ...], list[Choice]] = {}
    for chosen in found.values():
        picks = tuple(g.options[i] for g, i in zip(groups, chosen, strict=True) if i >= 0)
        if picks and sum(o.copies for o in picks) >= max(o.min_pipelines for o in picks):
            by_picks.setdefault(tuple(id(o) for o in picks), []).append(chosen)
    for alike in by_picks.values():
        chosen = min(alike, key=lambda c: ring.iteration_s(groups, c, batch)) if len(
            alike) > 1 else alike[0]
        picks = tuple(g.options[i] for g, i in zip(groups, chosen, strict=True) if i >= 0)
        yield PerTypeSet(picks=picks, sync_s=float(ring.sync_s(groups, chosen)[0]))


Choice = tuple[int, ...]
"""Per class, the index of its option (-1: the class sits idle)."""


class _ClassArrays:
    """One class's options as arrays. An option whose copies' stages tile the class's nodes
    side by side (`_side_by_side`), but whose copies do not all fit in one node, has two
    rows: placed a copy at a time (transfers as its split priced them, rings between nodes)
    and stage-major (every ring inside a node, transfers between nodes wherever consecutive
    stages sit on two). No placement gives both."""

    def __init__(self, tables: ScenarioTables, group: Sequence[ClassOption]) -> None:
        key = group[0].template.stages[0].resource
        node_gpus, node_nics = _class_nodes(tables, key)
        largest = max(node_gpus)
        copies = np.array([o.copies for o in group], dtype=float)
        whole = copies * np.array([o.template.num_gpus for o in group]) <= largest
        stage_major = np.array([_side_by_side(node_gpus, o) for o in group]) & ~whole
        # Rows: every option as placed a copy at a time, then the stage-major ones.
        rows = np.concatenate((np.arange(len(group)), np.flatnonzero(stage_major)))
        self.options = [group[k] for k in rows.tolist()]
        self.key = key
        t = [o.template for o in self.options]
        self.copies = copies[rows]
        self.min_pipelines = np.array([o.min_pipelines for o in self.options], dtype=float)
        # Samples per micro-batch slot of all copies.
        self.samples = self.copies * np.array([x.micro_batch for x in t], dtype=float)
        # Copies that each fit in a node are placed one node at a time (node-aligned, as
        # `assemble.place` places them): none straddles two nodes, and the GPUs they leave
        # idle spread over the nodes, whose shared interfaces then serve fewer rings.
        share, aligned = _aligned_shares(node_gpus, node_nics, group)
        apart = np.arange(len(group), len(rows))
        self.stage_major = np.zeros(len(rows), dtype=bool)
        self.stage_major[apart] = True
        self.share = share[rows]
        self.aligned = aligned[rows] & ~self.stage_major
        straddle = np.where(aligned, 0.0, _straddle_s(tables, group))[rows]
        straddle[apart] = 0.0
        self.fill = np.array([x.fill_s for x in t]) + straddle
        self.bottleneck = np.array([x.bottleneck_s for x in t]) + straddle
        fill_added, bottleneck = _stage_major_s(tables, [group[k] for k in rows[apart]],
                                                node_gpus[0])
        self.fill[apart] += fill_added
        self.bottleneck[apart] = bottleneck
        self.cap = np.array([x.max_micro_batches or 10**9 for x in t], dtype=float)
        # Per stage, parameters per GPU and layers: the sync ring's bytes and latency steps.
        # Shallower pipelines are padded with empty stages at tp 1 (no bytes, no layers).
        depth = max(x.num_stages for x in t)
        bounds = np.array([x.partition.bounds + (x.partition.bounds[-1],) * (depth - x.num_stages)
                           for x in t])
        tps = np.array([[s.tp for s in x.stages] + [1] * (depth - x.num_stages) for x in t],
                       dtype=float)
        # Alone, a class's rings stay inside a node where its copies are placed stage-major
        # (their stages side by side) or where the whole set fits in one node.
        self.rings_inside = whole[rows] | self.stage_major
        self.stage_params = (tables.params[bounds[:, 1:]] - tables.params[bounds[:, :-1]]) / tps
        self.stage_layers = (bounds[:, 1:] - bounds[:, :-1]).astype(float)
        self.heaviest = self.stage_params.max(axis=1)

    def covered_at(self, index: np.ndarray | int, target: np.ndarray) -> np.ndarray:
        """Samples option `index[j]` covers by `target[j]`, in whole micro-batches (the
        arrays broadcast; one option for every target where `index` is an int). Called tens
        of thousands of times per search: plain minimum and maximum, not clip."""
        whole = np.floor((target - self.fill[index]) / self.bottleneck[index]) + 1
        whole = np.minimum(np.maximum(whole, 0), self.cap[index])
        return self.samples[index] * whole


def _class_nodes(tables: ScenarioTables, key: tuple[str, str | None]
                 ) -> tuple[list[int], list[int]]:
    """GPUs and network interfaces of each node of a class, fewest GPUs first (the order in
    which best-fit placement fills nodes that are all free)."""
    (cls,) = [c for c in tables.classes if c.key == key]
    nodes = sorted(cls.nodes, key=lambda n: n.gpus)
    return [n.gpus for n in nodes], [n.num_nics for n in nodes]


def _aligned_shares(node_gpus: list[int], node_nics: list[int],
                    group: Sequence[ClassOption]) -> tuple[np.ndarray, np.ndarray]:
    """Per option: the least share of a node's interfaces a sync ring through its nodes gets
    (`min(1, nics / GPUs used)`, section 3), and whether its copies fit one node each
    (placed node-aligned). Otherwise they pack node after node, every node used whole."""
    packed = min(min(1.0, nics / gpus) for gpus, nics in zip(node_gpus, node_nics, strict=True))
    share = np.full(len(group), packed)
    aligned = np.zeros(len(group), dtype=bool)
    for k, option in enumerate(group):
        per_copy = option.template.num_gpus
        left = option.copies
        if sum(gpus // per_copy for gpus in node_gpus) < left:
            continue
        least = 1.0
        for gpus, nics in zip(node_gpus, node_nics, strict=True):
            here = min(left, gpus // per_copy)
            if here > 0:
                least = min(least, nics / (here * per_copy))
            left -= here
        share[k], aligned[k] = min(1.0, least), True
    return share, aligned


def _straddle_s(tables: ScenarioTables, group: Sequence[ClassOption]) -> np.ndarray:
    """Per option of one class, what packing its copies node after node adds to its
    heaviest stage's time per micro-batch. A template is split and priced for a copy that
    starts at a node's first GPU; copies that start later in a node cross nodes at other
    boundaries, where each stage beside a crossing sends or receives across nodes in its
    forward and its backward (blocking transfers). The plan waits for its slowest copy: the
    worst start counts."""
    added = np.zeros(len(group))
    ctx = TemplateContext(tables, tables.scenario.job.schedule)
    if not ctx.blocking or tables.num_layers < 2:
        return added
    cls = ctx.by_key[group[0].template.stages[0].resource]
    inside = ctx.link(cls.key, cls.key, same_node=True)
    across = ctx.link(cls.key, cls.key, same_node=False)
    moved = float(tables.output_bytes[:-1].max())
    known: dict[tuple[int, int], float] = {}  # by template and copies that matter
    for k, option in enumerate(group):
        template = option.template
        depth = template.num_stages
        # As the template's split priced them (none apart under `local`).
        per_node = stages_per_node(cls, template.stages[0].tp, ctx.schedule)
        if (option.copies < 2 or depth < 2 or per_node < 2 or per_node % depth == 0
                or depth % per_node == 0):
            continue
        key = (id(template), min(option.copies, per_node))
        if key in known:
            added[k] = known[key]
            continue
        b = template.micro_batch
        per_crossing = 2 * max(0.0, moved * b / across.bytes_per_s + across.latency_s
                               - moved * b / inside.bytes_per_s - inside.latency_s)
        starts = np.array(sorted({(i * depth) % per_node
                                  for i in range(min(option.copies, per_node))}))
        # Per start (rows), per stage: the crossings beside it.
        crossing = ((starts[:, None] + np.arange(1, depth)[None, :]) % per_node == 0)
        beside = np.zeros((len(starts), depth))
        beside[:, :-1] += crossing
        beside[:, 1:] += crossing
        aligned = np.array(template.partition.stage_s) - per_crossing * beside[starts == 0]
        worst = float((aligned + per_crossing * beside).max())
        added[k] = known[key] = max(0.0, worst - template.bottleneck_s)
    return added


def _side_by_side(node_gpus: list[int], option: ClassOption) -> bool:
    """Whether stage-major placement keeps every stage's copies in one node: each stage's
    copies (copies x tp GPUs, stage after stage from a node's first GPU) divide every node
    of the class, all alike, and there are slots for every stage."""
    width = option.copies * max(s.tp for s in option.template.stages)
    return (option.copies > 1 and len(set(node_gpus)) == 1 and node_gpus[0] % width == 0
            and sum(node_gpus) // width >= option.template.num_stages)


def _stage_major_s(tables: ScenarioTables, group: Sequence[ClassOption], node: int
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Per option of one class placed stage-major on its nodes of `node` GPUs
    (`_side_by_side`: each stage's copies on one node, as many stages to a node as fit):
    what its fill gains, and its heaviest
    stage's time per micro-batch, with each transfer over the link its placement gives
    rather than the one its split priced. A blocking transfer occupies both its stages,
    forward and backward; one that does not block delays the fill alone."""
    fill_added = np.zeros(len(group))
    bottleneck = np.array([o.template.bottleneck_s for o in group])
    if not group:
        return fill_added, bottleneck
    ctx = TemplateContext(tables, tables.scenario.job.schedule)
    key = group[0].template.stages[0].resource
    links = (ctx.link(key, key, same_node=True), ctx.link(key, key, same_node=False))
    for k, option in enumerate(group):
        template = option.template
        bounds, b = template.partition.bounds, template.micro_batch
        per_node = node // (option.copies * max(s.tp for s in template.stages))
        placed = []
        for s, (end, priced) in enumerate(zip(bounds[1:-1], template.transfer_s, strict=True)):
            link = links[(s + 1) % per_node == 0]  # a node holds `per_node` stages
            placed.append(link.latency_s + tables.output_at[end - 1] * b / link.bytes_per_s
                          - priced)
        if not placed:
            continue
        delta = np.array(placed)
        if ctx.blocking:
            stage_s = np.array(template.partition.stage_s)
            stage_s[:-1] += 2 * delta
            stage_s[1:] += 2 * delta
            bottleneck[k] = float(stage_s.max())
            fill_added[k] = 4 * float(delta.sum())
        else:
            fill_added[k] = 2 * float(delta.sum())
    return fill_added, bottleneck


class _Chosen:
    """The options `choice` picks, as columns: the samples they cover together by each
    target, in one pass rather than one per class (`_least_times` asks some twenty-five
    times per class it moves). Whole micro-batches times samples are whole numbers: the sum
    is exact in any order."""

    def __init__(self, groups: Sequence[_ClassArrays], choice: Choice) -> None:
        picked = [(g, i) for g, i in zip(groups, choice, strict=True) if i >= 0]
        self.fill, self.bottleneck, self.cap, self.samples = (
            np.array([getattr(g, name)[i] for g, i in picked])[:, None]
            for name in ("fill", "bottleneck", "cap", "samples"))

    def covered(self, target: np.ndarray) -> np.ndarray:
        if not len(self.fill):
            return np.zeros(len(target))
        whole = np.floor((target[None, :] - self.fill) / self.bottleneck) + 1
        whole = np.minimum(np.maximum(whole, 0), self.cap)
        return (self.samples * whole).sum(axis=0)


def _under_thresholds(groups: Sequence[_ClassArrays], thresholds: np.ndarray, batch: int
                      ) -> list[Choice]:
    """Per threshold on the heaviest stage: every class takes its option under it that covers
    the most samples by the least time at which the chosen set covers the batch (bisected,
    all thresholds at once: coverage grows with time)."""
    allowed = [g.heaviest[None, :] <= thresholds[:, None] for g in groups]

    def best_at(target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per threshold, each class's pick (-1: none covers anything) and the samples all
        picks cover by `target`."""
        rows = np.arange(len(target))
        picks, total = [], np.zeros(len(target))
        for g, ok in zip(groups, allowed, strict=True):
            covered = np.where(ok, g.covered_at(np.arange(len(g.options))[None, :],
                                                target[:, None]), -1.0)
            best = covered.argmax(axis=1)
            value = covered[rows, best]
            picks.append(np.where(value > 0, best, -1))
            total += np.where(value > 0, value, 0.0)
        return np.stack(picks, axis=1), total

    low, high = np.zeros(len(thresholds)), np.ones(len(thresholds))
    never = np.zeros(len(thresholds), dtype=bool)
    while (short := (best_at(high)[1] < batch) & ~never).any():
        high = np.where(short, high * 2, high)
        never |= high > 1e9
    for _ in range(BISECTIONS):
        middle = (low + high) / 2
        enough = best_at(middle)[1] >= batch
        low, high = np.where(enough, low, middle), np.where(enough, middle, high)
    picks = np.where(never[:, None], -1, best_at(high)[0])
    return [tuple(int(i) for i in row) for row in picks.tolist()]


def _least_times(groups: Sequence[_ClassArrays], others: Choice, moving: int, batch: int) -> np.ndarray:
    """Per option of class `moving` (and, last, none), the least time at which it and the
    other classes' choices cover the batch (inf where they never do)."""
    g = groups[moving]
    count = len(g.options) + 1
    low, high = np.zeros(count), np.full(count, 1.0)
    rest = _Chosen(groups, tuple(-1 if k == moving else i for k, i in enumerate(others)))

    index = np.arange(count - 1)

    def enough(target: np.ndarray) -> np.ndarray:
        own = np.concatenate((g.covered_at(index, target[:-1]), [0.0]))
        return rest.covered(target) + own >= batch

    for _ in range(60):
        short = ~enough(high)
        if not short.any():
            break
        high = np.where(short, high * 2, high)
    never = ~enough(high)
    for _ in range(BISECTIONS):
        middle = (low + high) / 2
        ok = enough(middle)
        low, high = np.where(ok, low, middle), np.where(ok, middle, high)
    return np.where(never, np.inf, high)


class _Ring:
    """Estimated sync time of a set of options: every layer's ring spans all pipelines and
    runs at the slowest link among the chosen classes (shared interfaces included)."""

    def __init__(self, tables: ScenarioTables, groups: Sequence[_ClassArrays]) -> None:
        scenario = tables.scenario
        self.grad_bytes = scenario.job.grad_bytes
        by_key = {c.key: c for c in tables.classes}
        self.inside = [(scenario.cluster.intra_node[g.key[0]].bandwidth_gb_per_s * 1e9,
                        scenario.cluster.intra_node[g.key[0]].latency_us * 1e-6) for g in groups]
        self.links: dict[tuple[int, int], tuple[float, float]] = {}
        for a, b in itertools.combinations_with_replacement(range(len(groups)), 2):
            ca, cb = by_key[groups[a].key], by_key[groups[b].key]
            link = zone_link(scenario, ca.zone, cb.zone)
            self.links[(a, b)] = (link.bandwidth_gb_per_s * 1e9, link.latency_us * 1e-6)

    def link(self, used: Sequence[int], shares: dict[int, Any]) -> tuple[Any, float]:
        """Bandwidth (per entry of the shares given as arrays) and latency of the slowest
        hop between the nodes of the classes `used`, each class's interfaces shared by
        `shares[class]`."""
        pairs = list(itertools.combinations_with_replacement(sorted(used), 2))
        bandwidth = functools.reduce(np.minimum, [
            self.links[(a, b)][0] * np.minimum(shares[a], shares[b]) for a, b in pairs])
        return bandwidth, max(self.links[pair][1] for pair in pairs)

    def sync_s(self, groups: Sequence[_ClassArrays], choice: Choice, moving: int | None = None
               ) -> np.ndarray:
        """Sync of `choice`, or (with `moving`) of it with each option of that class in turn
        (and, last, with none)."""
        fixed = [k for k, i in enumerate(choice) if i >= 0 and k != moving]
        fixed_n = sum(float(groups[k].copies[choice[k]]) for k in fixed)
        fixed_rows = [(groups[k].stage_params[choice[k]], groups[k].stage_layers[choice[k]])
                      for k in fixed]
        shares: dict[int, Any] = {k: float(groups[k].share[choice[k]]) for k in fixed}
        if moving is None:
            if len(fixed) == 1:  # one class alone: its replicas may share a node's link
                (k,) = fixed
                g = groups[k]
                i = choice[k]
                return self._worst(fixed, np.array([fixed_n]), [],
                                   (g.stage_params[i:i + 1], g.stage_layers[i:i + 1]),
                                   shares, g.rings_inside[i:i + 1])
            return np.array([self._worst(fixed, np.array([fixed_n]), fixed_rows, None,
                                         shares)[0]])
        g = groups[moving]
        with_it = self._worst([*fixed, moving], fixed_n + g.copies, fixed_rows,
                              (g.stage_params, g.stage_layers), {**shares, moving: g.share},
                              g.rings_inside if not fixed else None)
        without = self.sync_s(groups, tuple(-1 if k == moving else i
                                            for k, i in enumerate(choice)))
        return np.concatenate((with_it, without))

    def _worst(self, used: Sequence[int], n: np.ndarray,
               rows: Sequence[tuple[np.ndarray, np.ndarray]],
               own: tuple[np.ndarray, np.ndarray] | None, shares: dict[int, Any],
               own_inside: np.ndarray | None = None) -> np.ndarray:
        """Largest stage sync time, per ring length in `n` (row j of `own`, and of an array
        in `shares`, goes with n[j])."""
        if not used:
            return np.full(len(n), np.inf)
        slowest, most_latency = self.link(used, shares)
        bandwidth = np.broadcast_to(slowest, n.shape).astype(float)
        latency = np.full(len(n), most_latency)
        if len(used) == 1 and own_inside is not None:
            # Replicas of one class whose stages fit side by side in a node, placed so,
            # keep every ring inside it (`_ClassArrays.rings_inside`, row j with n[j]).
            (only,) = used
            bandwidth = np.where(own_inside, self.inside[only][0], bandwidth)
            latency = np.where(own_inside, self.inside[only][1], latency)
        per_byte = np.where(n > 1, 2 * (n - 1) / np.maximum(n, 1), 0.0) * self.grad_bytes / bandwidth
        per_step = 2 * np.maximum(n - 1, 0) * latency
        worst = np.zeros(len(n))
        for stage_params, stage_layers in rows:
            worst = np.maximum(worst, (per_byte[:, None] * stage_params[None, :]
                                       + per_step[:, None] * stage_layers[None, :]).max(axis=1))
        if own is not None:
            worst = np.maximum(worst, (per_byte[:, None] * own[0]
                                       + per_step[:, None] * own[1]).max(axis=1))
        return worst

    def iteration_s(self, groups: Sequence[_ClassArrays], choice: Choice, batch: int) -> float:
        used = [k for k, i in enumerate(choice) if i >= 0]
        if not used:
            return float("inf")
        first = used[0]
        times = _least_times(groups, choice, first, batch)
        return float(times[choice[first]] + self.sync_s(groups, choice)[0])


def _enough_pipelines(groups: Sequence[_ClassArrays], choice: Choice, moving: int) -> np.ndarray:
    """Per option of class `moving`, whether the set then has as many pipelines as each of
    its options' state sizing assumes."""
    others = [(g, i) for k, (g, i) in enumerate(zip(groups, choice, strict=True))
              if k != moving and i >= 0]
    count = sum(g.copies[i] for g, i in others)
    needed = max((g.min_pipelines[i] for g, i in others), default=1.0)
    g = groups[moving]
    return count + g.copies >= np.maximum(needed, g.min_pipelines)


def _descent(groups: Sequence[_ClassArrays], ring: _Ring, start: Choice, batch: int) -> Iterator[Choice]:
    """Each class in turn takes its option of least estimated iteration time, the others
    fixed, until none moves; every set passed through."""
    choice = list(start)
    for _ in range(DESCENT_ROUNDS):
        moved = False
        for k, g in enumerate(groups):
            scores = _least_times(groups, tuple(choice), k, batch) + ring.sync_s(groups, tuple(choice), k)
            scores[:-1] = np.where(_enough_pipelines(groups, tuple(choice), k), scores[:-1], np.inf)
            best = int(np.argmin(scores))
            pick = best if best < len(g.options) else -1
            current = choice[k] if choice[k] >= 0 else len(g.options)
            if pick != choice[k] and scores[best] < scores[current] * (1 - 1e-9):
                choice[k] = pick
                moved = True
                yield tuple(choice)
        if not moved:
            return
