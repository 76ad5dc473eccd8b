"""Drafts: pipelines with batch shares, ranked cheaply before any GPU is named.

The search produces many drafts; only the most promising are placed on
concrete GPUs (`realize`), and only the best placed ones are judged by the
full estimator. Each step is costlier and sees fewer plans.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from planner.costs import link_between, node_index, transfer_s
from planner.documents import Plan, Schedule
from planner.search.assemble import PlacementStyle, build_plan, place, split_batch
from planner.search.quick import estimate_sync_s, inside_sync_s, replicas_sync_s, rough_sync_s
from planner.search.tables import ScenarioTables
from planner.search.templates import PipelineTemplate
from planner.simulate import simulate_pipeline

__all__ = ["Draft", "Candidate", "Replicas", "draft", "identical_draft", "replicas_draft",
           "contending_replicas", "realize", "best_realized"]

SIMULATED_UP_TO = 64
"""Pipelines of at most this many operations (stages times micro-batches) are timed by the
event simulation in drafts rather than by fill + (m - 1) * bottleneck. With few
micro-batches that model overstates unbalanced pipelines: a light stage behind a heavy
one finishes its fill inside the heavy one's (8 layers split 7 + 1 over an H100 and an
A100, 2 micro-batches: 11% over), and ranks them out of the finalists."""
ROUGH_SLACK = 1.25
"""Drafts whose rough time exceeds the best draft's by more are not placed."""


@dataclass(frozen=True, kw_only=True)
class Draft:
    pipelines: tuple[PipelineTemplate, ...]
    micro_batches: tuple[int, ...]
    pipeline_s: float
    sync_s: float
    origin: str

    @property
    def rough_s(self) -> float:
        return self.pipeline_s + self.sync_s


@dataclass(kw_only=True, eq=False)
class Candidate:
    """A placed plan with the search's quick estimate of its iteration time.

    The plan document is built on first use: most candidates are ranked away
    before anyone reads them, and at thousands of GPUs building one is costly."""

    build: Callable[[], Plan]
    quick_s: float
    origin: str
    known_depths: frozenset[int] | None = None
    """Its pipelines' stage counts where known before the plan is built."""
    placement_of: int | None = None
    """The serial of the draft it places, shared by that draft's placements (None: a plan
    of its own); unique within the process that placed it."""
    pipelines: tuple[PipelineTemplate, ...] = ()
    """The templates of the draft it places (empty: a plan of its own)."""

    @functools.cached_property
    def plan(self) -> Plan:
        return self.build()

    @property
    def depths(self) -> frozenset[int]:
        """Its pipelines' stage counts (without building the plan where they are known)."""
        if self.known_depths is None:
            self.known_depths = frozenset(len(p.stages) for p in self.plan.pipelines)
        return self.known_depths

    @staticmethod
    def of(plan: Plan, *, quick_s: float, origin: str) -> Candidate:
        return Candidate(build=functools.partial(_given, plan), quick_s=quick_s, origin=origin)


def _given(plan: Plan) -> Plan:
    return plan


def draft(tables: ScenarioTables, pipelines: Sequence[PipelineTemplate], origin: str, *,
          sync_s: float | None = None) -> Draft | None:
    """Water-fill the batch over `pipelines`; those that get no micro-batch are dropped.
    `sync_s`: the set's sync as its maker estimated it, in place of the rough estimate."""
    micro_batches = split_batch(pipelines, tables.scenario.job.global_batch_size)
    if micro_batches is None:
        return None
    used = [(t, m) for t, m in zip(pipelines, micro_batches, strict=True) if m > 0]
    return _draft(tables, [t for t, _ in used], [m for _, m in used], origin, sync_s)


def identical_draft(
    tables: ScenarioTables, template: PipelineTemplate, num_pipelines: int, origin: str
) -> Draft | None:
    m = _replica_micro_batches(tables, template, num_pipelines)
    if m is None:
        return None
    return _draft(tables, [template] * num_pipelines, [m] * num_pipelines, origin)


def replicas_draft(
    tables: ScenarioTables, template: PipelineTemplate, num_pipelines: int, origin: str
) -> Draft | None:
    """`num_pipelines` replicas of `template`: an equal share each where their count divides
    the batch, else shares differing by one micro-batch (water-filled), as the origin says."""
    if tables.scenario.job.global_batch_size % (num_pipelines * template.micro_batch) == 0:
        return identical_draft(tables, template, num_pipelines, origin)
    return draft(tables, [template] * num_pipelines,
                 f"{origin}, shares differing by one micro-batch")


def _replica_micro_batches(
    tables: ScenarioTables, template: PipelineTemplate, num_pipelines: int
) -> int | None:
    """Micro-batches of each of `num_pipelines` replicas sharing the batch evenly."""
    m = _even_share(tables, template.micro_batch, num_pipelines)
    return m if m is not None and _keeps_in_flight(template, m) else None


def _even_share(tables: ScenarioTables, micro_batch: int, num_pipelines: int) -> int | None:
    """Micro-batches of each of `num_pipelines` replicas where they split the batch evenly."""
    batch = tables.scenario.job.global_batch_size
    if batch % (num_pipelines * micro_batch):
        return None
    return batch // (num_pipelines * micro_batch)


def _keeps_in_flight(template: PipelineTemplate, num_micro_batches: int) -> bool:
    """Whether the template holds that many micro-batches in flight (GPipe keeps them all)."""
    return template.max_micro_batches is None or num_micro_batches <= template.max_micro_batches


@dataclass(frozen=True, kw_only=True)
class Replicas:
    """Identical replicas of one template at several counts, most first. The template is
    built only once some count could contend: `floor_s(m)` bounds one pipeline's time for
    m micro-batches from below without it (the baselines offer thousands of templates, and
    under `local`, where every depth fits memory, nine in ten cannot contend)."""

    build: Callable[[], PipelineTemplate | None]
    micro_batch: int
    counts: Iterable[int]
    origin: str
    floor_s: Callable[[int], float] = lambda m: 0.0


def contending_replicas(tables: ScenarioTables, offers: Iterable[Replicas], keep: int,
                        slack: float = ROUGH_SLACK) -> list[Draft]:
    """The identical-replica drafts of `offers` that `best_realized(..., keep, slack)` could
    place, in the order offered: a draft whose pipeline time alone exceeds the `keep`-th
    least rough time so far, or `slack` times the least, never is (sync only adds to it).
    The baselines offer thousands of replica counts, and the pipeline time is cheap beside
    the sync estimate. Fewer replicas only lengthen each pipeline: counts are offered most
    first, and a template's first count out of contention ends its offer."""
    kept: list[Draft] = []
    ranked: list[float] = []  # negated rough times of the `keep` least so far (a max-heap)
    least = math.inf
    for offer in offers:
        template: PipelineTemplate | None = None
        for n in offer.counts:
            m = _even_share(tables, offer.micro_batch, n)
            if m is None:
                continue
            bound = min(-ranked[0] if len(ranked) == keep else math.inf, least * slack)
            if offer.floor_s(m) > bound:
                break
            if template is None and (template := offer.build()) is None:
                break
            if not _keeps_in_flight(template, m):
                continue
            if pipeline_s(tables, template, m) > bound:
                break
            found = _draft(tables, [template] * n, [m] * n, offer.origin)
            kept.append(found)
            least = min(least, found.rough_s)
            heapq.heappush(ranked, -found.rough_s)
            if len(ranked) > keep:
                heapq.heappop(ranked)
    return kept


def _draft(
    tables: ScenarioTables, templates: list[PipelineTemplate], counts: list[int], origin: str,
    known_sync_s: float | None = None,
) -> Draft:
    distinct = {id(t) for t in templates}
    one = templates[0]
    if known_sync_s is not None:
        sync = known_sync_s
    elif len(distinct) > 1:
        sync = rough_sync_s(tables, templates)
    elif _inside_one_node(tables, one, len(templates)):
        sync = inside_sync_s(tables, one, len(templates))
    elif len(one.gpus()) > 1:
        sync = replicas_sync_s(tables, one, len(templates))
    else:
        sync = one.sync_s(len(templates))
    return Draft(pipelines=tuple(templates), micro_batches=tuple(counts),
                 pipeline_s=max(pipeline_s(tables, t, m) for t, m in zip(templates, counts,
                                                                          strict=True)),
                 sync_s=sync, origin=origin)


def pipeline_s(tables: ScenarioTables, template: PipelineTemplate, num_micro_batches: int) -> float:
    """One pipeline's time for `num_micro_batches`: simulated where it is short (1F1B or
    GPipe with blocking transfers, whose times the template's stage times hold), else the
    template's linear model."""
    m = num_micro_batches
    job = tables.scenario.job
    if (template.num_stages == 1 or not job.blocking_transfers
            or job.schedule not in (Schedule.ONE_F_ONE_B, Schedule.GPIPE)
            or template.num_stages * m > SIMULATED_UP_TO):
        return template.time_s(m)
    if m not in template.simulated:
        forward, backward = [], []
        bounds = template.partition.bounds
        for s, (shape, stage_s) in enumerate(zip(template.stages, template.partition.stage_s,
                                                 strict=True)):
            point = tables.points[(shape.gpu_type, template.micro_batch, shape.tp)]
            f = float(point.forward_s[bounds[s + 1]] - point.forward_s[bounds[s]])
            b = float(point.backward_s[bounds[s + 1]] - point.backward_s[bounds[s]])
            transfers = (stage_s - f - b) / 2  # in and out, once each way
            forward.append(f + transfers)
            backward.append(b + transfers)
        template.simulated[m] = simulate_pipeline(
            forward, backward, [0.0] * (template.num_stages - 1), m, job.schedule,
            blocking_transfers=True)
    return template.simulated[m]


def _inside_one_node(tables: ScenarioTables, template: PipelineTemplate, n: int) -> bool:
    """Whether `n` replicas of a one-class template fit in one of its nodes, stage s of all
    of them side by side (stage-major placement keeps every ring inside that node)."""
    (key,) = template.gpus() if len(template.gpus()) == 1 else (None,)
    if key is None:
        return False
    largest = max(c.largest_node for c in tables.classes if c.key == key)
    return n * max(s.tp for s in template.stages) <= largest


_placed_drafts = itertools.count()
PLACEMENTS = (PlacementStyle(stage_major=False), PlacementStyle(stage_major=True),
              PlacementStyle(aligned=True))
"""The placements each draft is realized in; the node-aligned one where it differs from the
packed one. Neither wins everywhere: packing leaves whole nodes whole, aligning keeps
copies off two nodes and spreads idle GPUs (on held-out seed 73 at scale 1, aligning alone
made four plans slower, by up to 1.1%, and two faster)."""


def realize(tables: ScenarioTables, chosen: Draft) -> list[Candidate]:
    """Place a draft each way of PLACEMENTS."""
    out = []
    serial = next(_placed_drafts)
    placed: list[list[list[list[str]]]] = []
    for style in PLACEMENTS:
        gpus = place(tables, chosen.pipelines, style)
        if gpus is None or gpus in placed:  # aligned packs as plain wherever nothing straddles
            continue
        placed.append(gpus)
        quick = (chosen.pipeline_s + _placed_delta_s(tables, chosen, gpus)
                 + estimate_sync_s(tables, chosen.pipelines, gpus))
        kind = ("stage" if style.stage_major else "node-aligned pipeline" if style.aligned
                else "pipeline")
        build = functools.partial(build_plan, chosen.pipelines, chosen.micro_batches, gpus,
                                  tables.scenario.job.schedule)
        out.append(Candidate(build=build, quick_s=quick,
                             known_depths=frozenset(t.num_stages for t in chosen.pipelines),
                             origin=f"{chosen.origin}, {kind}-major placement",
                             placement_of=serial, pipelines=chosen.pipelines))
    return out


def _placed_delta_s(tables: ScenarioTables, chosen: Draft,
                    gpus: Sequence[Sequence[Sequence[str]]]) -> float:
    """How much longer the slowest pipeline takes with the transfers its placement gives
    (across nodes, or inside one) than with those its template's split priced: with blocking
    transfers each one is charged to both its stages, forward and backward."""
    scenario = tables.scenario
    if not scenario.job.blocking_transfers:
        return 0.0
    nodes = node_index(scenario).by_name
    before, after = 0.0, 0.0
    for template, m, placed in zip(chosen.pipelines, chosen.micro_batches, gpus, strict=True):
        stage_s = template.partition.stage_s
        time_s = template.fill_s + (m - 1) * template.bottleneck_s
        before = max(before, time_s)
        if not template.transfer_s:
            after = max(after, time_s)
            continue
        where = [nodes[stage[0].rpartition(":")[0]] for stage in placed]
        moved = list(stage_s)
        for s, priced in enumerate(template.transfer_s):
            sent = tables.output_at[template.partition.bounds[s + 1] - 1] * template.micro_batch
            delta = transfer_s(link_between(scenario, where[s], where[s + 1]), sent) - priced
            moved[s] += 2 * delta
            moved[s + 1] += 2 * delta
        fill = template.fill_s + sum(moved) - sum(stage_s)
        after = max(after, fill + (m - 1) * max(moved))
    return after - before


def best_realized(tables: ScenarioTables, drafts: Iterable[Draft | None], keep: int,
                  slack: float = ROUGH_SLACK) -> list[Candidate]:
    """Realize the `keep` drafts of least rough time; their placed candidates, best first."""
    ranked = sorted((d for d in drafts if d is not None), key=lambda d: d.rough_s)
    out: list[Candidate] = []
    for chosen in ranked[:keep]:
        # Placement shortens the sync rings a rough estimate assumes, but on no benchmark
        # scenario did a draft this far behind win once placed.
        if chosen.rough_s > ranked[0].rough_s * slack:
            break
        out.extend(realize(tables, chosen))
    return sorted(out, key=lambda c: c.quick_s)
