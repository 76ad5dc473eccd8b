"""Fleets and money: sub-fleets of a scenario, the cost/throughput frontier, objectives
under budgets, and what-if changes to a fleet (docs/formats.md, "Cost in US dollars").

The search plans one fleet for throughput. Everything here is built on it without
changing it: a question about money becomes a set of fleets (subsets of the GPU types,
partial fleets of each type's nodes, or changed fleets), each planned by the search,
then compared by price. Plans are mapped over fleets through a `Mapper`, so the edges
choose where they run (in turn, local processes, Ray tasks); the results are the same.

A plan found on a sub-fleet names the same GPUs as the whole fleet, so it is a plan of
the whole scenario too, with the left-out GPUs idle (and not paid for, by section 7).
"""

from __future__ import annotations

import functools
import itertools
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from planner.documents import Link, Node, Scenario, parse_scenario
from planner.errors import Infeasible, InvalidScenario, PlannerError, Problem
from planner.estimate import Evaluation, dominates, estimate_section, evaluate
from planner.search import PlanResult, SearchOptions
from planner.search import plan as search_plan
from planner.search.api import ProgressCallback

__all__ = [
    "Objective", "ObjectiveOptions", "BudgetNotMet", "Fleet", "FleetOutcome", "Mapper",
    "Solve", "sub_fleets", "node_subsets", "plan_fleet", "plan_fleet_with", "plan_fleets",
    "frontier", "choose",
    "plan_with_objective", "on_whole_scenario", "check_prices",
    "NodesAdded", "NodesRemoved", "FleetVariant", "apply_variant", "WhatIfRow", "what_if",
]

T = TypeVar("T")
R = TypeVar("R")
Mapper = Callable[[Callable[[T], R], Sequence[T]], Iterable[R]]
"""Applies a function to every item, yielding results in the items' order (`map` does)."""

DEFAULT_MAX_FLEETS = 48
FRACTIONS = (0.25, 0.5, 1.0)
"""Shares of each GPU type's nodes a partial fleet keeps (rounded up to whole nodes)."""


class Objective(StrEnum):
    THROUGHPUT = "throughput"
    """Most samples/s (under `max_usd_per_hour` when given)."""
    COST = "cost"
    """Least USD per million tokens (over `min_samples_per_s` when given)."""


@dataclass(frozen=True, kw_only=True)
class ObjectiveOptions(SearchOptions):
    """Search options with a goal in money. The time limit is per planned fleet."""

    objective: Objective = Objective.THROUGHPUT
    max_usd_per_hour: float | None = None
    """Budget: no plan whose GPUs cost more per hour. None: no budget."""
    min_samples_per_s: float | None = None
    """Floor: no plan slower than this. None: no floor."""
    max_fleets: int = DEFAULT_MAX_FLEETS
    """Most sub-fleets planned to answer (whole-type subsets come first)."""

    @property
    def needs_fleets(self) -> bool:
        """Whether the answer may be a sub-fleet's plan rather than the whole fleet's."""
        return (self.objective is not Objective.THROUGHPUT or self.max_usd_per_hour is not None
                or self.min_samples_per_s is not None)

    def search_options(self) -> SearchOptions:
        """The options the search itself takes."""
        fields = {name: getattr(self, name) for name in SearchOptions.__dataclass_fields__}
        return SearchOptions(**fields)


class BudgetNotMet(Infeasible):
    """No planned fleet meets the budget and the floor; `closest` is the plan nearest to
    meeting them."""

    def __init__(self, message: str, closest: FleetOutcome | None) -> None:
        super().__init__(message)
        self.closest = closest


@dataclass(frozen=True, kw_only=True)
class Fleet:
    label: str
    """What the fleet keeps, e.g. `A100-80G 2/4 nodes, V100-32G 4/4 nodes`."""
    scenario: Scenario


@dataclass(frozen=True, kw_only=True)
class FleetOutcome:
    """One fleet's plan, or why it has none."""

    label: str
    result: PlanResult | None = None
    error: str | None = None

    @property
    def samples_per_s(self) -> float | None:
        return None if self.result is None else self.result.evaluation.samples_per_s

    @property
    def usd_per_hour(self) -> float | None:
        return None if self.result is None else self.result.evaluation.usd_per_hour

    @property
    def priced(self) -> bool:
        return self.samples_per_s is not None and self.usd_per_hour is not None


def with_nodes(scenario: Scenario, nodes: list[Node]) -> Scenario:
    """`scenario` on other nodes (links and profiles unchanged), not yet validated."""
    return scenario.model_copy(update={"cluster": scenario.cluster.model_copy(
        update={"nodes": nodes})})


def node_subsets(scenario: Scenario, key: Callable[[Node], str]
                 ) -> list[tuple[tuple[str, ...], Scenario]]:
    """`scenario` on the nodes of each proper, non-empty subset of the values `key` gives
    its nodes (GPU types, zones), the rest left out; each with the values it keeps."""
    values = sorted({key(n) for n in scenario.cluster.nodes})
    return [(kept, with_nodes(scenario, [n for n in scenario.cluster.nodes if key(n) in kept]))
            for count in range(1, len(values)) for kept in itertools.combinations(values, count)]


def _nodes_by_type(scenario: Scenario) -> dict[str, list[Node]]:
    by_type: dict[str, list[Node]] = {}
    for node in scenario.cluster.nodes:
        by_type.setdefault(node.gpu_type, []).append(node)
    return dict(sorted(by_type.items()))


def _kept_counts(num_nodes: int) -> list[int]:
    """Node counts a partial fleet keeps of a type with `num_nodes` nodes, ascending."""
    return sorted({max(1, math.ceil(num_nodes * f)) for f in FRACTIONS})


def sub_fleets(scenario: Scenario, max_fleets: int = DEFAULT_MAX_FLEETS) -> list[Fleet]:
    """Fleets to plan for a question about money, at most `max_fleets`: every non-empty
    subset of the GPU types with all their nodes first (so the whole fleet is among
    them), then each subset at the same share of every type's nodes, then mixed shares;
    the first nodes of a type in document order are the ones kept."""
    if max_fleets < 1:
        raise ValueError(f"max_fleets must be at least 1, not {max_fleets}")
    by_type = _nodes_by_type(scenario)
    names = list(by_type)
    subsets = [s for k in range(len(names), 0, -1) for s in itertools.combinations(names, k)]
    counts: list[dict[str, int]] = [{t: len(by_type[t]) for t in s} for s in subsets]
    for fraction in sorted(FRACTIONS[:-1], reverse=True):
        counts += [{t: max(1, math.ceil(len(by_type[t]) * fraction)) for t in s} for s in subsets]
    for s in subsets:
        counts += [dict(zip(s, c, strict=True))
                   for c in itertools.product(*(_kept_counts(len(by_type[t])) for t in s))]
    fleets: list[Fleet] = []
    seen: set[tuple[tuple[str, int], ...]] = set()
    for kept in counts:
        key = tuple(sorted(kept.items()))
        if key in seen:
            continue
        seen.add(key)
        nodes = [n for t, k in kept.items() for n in by_type[t][:k]]
        label = ", ".join(f"{t} {k}/{len(by_type[t])} nodes" for t, k in kept.items())
        fleets.append(Fleet(label=label, scenario=with_nodes(scenario, nodes)))
        if len(fleets) == max_fleets:
            break
    return fleets


@dataclass(frozen=True, kw_only=True)
class FleetTask:
    """One fleet to plan: picklable, so a process or a Ray task can take it."""

    fleet: Fleet
    options: SearchOptions


Solve = Callable[[Scenario, SearchOptions], PlanResult]
"""What plans one fleet: the search (`planner.plan`) unless an edge runs it elsewhere."""


def plan_fleet(task: FleetTask) -> FleetOutcome:
    """Plan one fleet with the search; a fleet it refuses is an outcome with its error."""
    return plan_fleet_with(search_plan, task)


def plan_fleet_with(solve: Solve, task: FleetTask) -> FleetOutcome:
    try:
        result = solve(task.fleet.scenario, task.options)
    except PlannerError as error:
        return FleetOutcome(label=task.fleet.label, error=f"{type(error).__name__}: {error}")
    return FleetOutcome(label=task.fleet.label, result=result)


def plan_fleets(
    fleets: Sequence[Fleet],
    options: SearchOptions,
    *,
    mapper: Mapper[FleetTask, FleetOutcome] = map,
    progress: ProgressCallback | None = None,
    solve: Solve | None = None,
) -> list[FleetOutcome]:
    """Every fleet's outcome, in the fleets' order. `solve` replaces the search (it must
    then be picklable for a mapper that crosses processes)."""
    tasks = [FleetTask(fleet=f, options=options) for f in fleets]
    plan_one = plan_fleet if solve is None else functools.partial(plan_fleet_with, solve)
    outcomes = []
    for done, outcome in enumerate(mapper(plan_one, tasks), start=1):
        outcomes.append(outcome)
        if progress is not None:
            progress(done / len(tasks), f"planned {outcome.label}")
    return outcomes


def frontier(outcomes: Iterable[FleetOutcome]) -> list[FleetOutcome]:
    """The priced outcomes no other dominates (section 7), cheapest first; of equal
    (samples/s, USD/hour) points the first is kept."""
    priced = [o for o in outcomes if o.priced and o.result is not None
              and o.result.evaluation.valid]
    points: list[FleetOutcome] = []
    seen: set[tuple[float | None, float | None]] = set()
    for o in priced:
        key = (o.samples_per_s, o.usd_per_hour)
        if key not in seen and not any(dominates(other, o) for other in priced):
            seen.add(key)
            points.append(o)
    return sorted(points, key=lambda o: (o.usd_per_hour, o.samples_per_s))


def _evaluation(outcome: FleetOutcome) -> Evaluation:
    assert outcome.result is not None, "only planned outcomes are chosen"
    return outcome.result.evaluation


def _shortfall(outcome: FleetOutcome, options: ObjectiveOptions) -> float:
    """How far an outcome is from meeting the budget and the floor, as relative excess."""
    evaluation = _evaluation(outcome)
    over = 0.0
    if options.max_usd_per_hour is not None and evaluation.usd_per_hour is not None:
        over += max(0.0, evaluation.usd_per_hour / max(options.max_usd_per_hour, 1e-12) - 1.0)
    if options.min_samples_per_s and evaluation.samples_per_s is not None:
        over += max(0.0, 1.0 - evaluation.samples_per_s / options.min_samples_per_s)
    return over


def choose(outcomes: Sequence[FleetOutcome], options: ObjectiveOptions) -> FleetOutcome:
    """The outcome best for the objective among those within the budget and the floor;
    `BudgetNotMet` naming the closest plan's numbers when none is."""
    priced = [o for o in outcomes if o.priced]
    meets = [o for o in priced if _shortfall(o, options) == 0.0]
    if meets:
        if options.objective is Objective.COST:
            return min(meets, key=lambda o: (_evaluation(o).usd_per_million_tokens or math.inf,
                                             -(o.samples_per_s or 0.0)))
        return max(meets, key=lambda o: (o.samples_per_s or 0.0, -(o.usd_per_hour or 0.0)))
    asked = " and ".join(part for part in (
        None if options.max_usd_per_hour is None
        else f"costs at most ${options.max_usd_per_hour:g}/hour",
        None if options.min_samples_per_s is None
        else f"reaches {options.min_samples_per_s:g} samples/s") if part)
    if not priced:
        first = next((o for o in outcomes if o.error is not None), None)
        raise BudgetNotMet(f"none of the {len(outcomes)} fleets tried has a priced plan"
                           + ("" if first is None else f" (first, {first.label}: {first.error})"),
                           None)
    closest = min(priced, key=lambda o: _shortfall(o, options))
    raise BudgetNotMet(
        f"no plan over {len(outcomes)} fleets (subsets of the GPU types and partial fleets) "
        f"{asked}; the closest, on {closest.label}, reaches {closest.samples_per_s:.4g} "
        f"samples/s at ${closest.usd_per_hour:.4g}/hour: raise max_usd_per_hour or lower "
        "min_samples_per_s", closest)


def check_prices(scenario: Scenario) -> None:
    """`InvalidScenario` naming every GPU type in the fleet without an hourly price."""
    used = {n.gpu_type for n in scenario.cluster.nodes}
    problems = [Problem(path=f"gpu_types.{t}.hourly_usd",
                        message="a cost objective, budget or frontier needs the price of "
                        "every GPU type in the cluster; give hourly_usd")
                for t in sorted(used) if scenario.gpu_types[t].hourly_usd is None]
    if problems:
        raise InvalidScenario(problems)


def plan_with_objective(
    scenario: Scenario,
    options: ObjectiveOptions,
    progress: ProgressCallback | None = None,
    *,
    mapper: Mapper[FleetTask, FleetOutcome] = map,
    solve: Solve | None = None,
) -> PlanResult:
    """The plan best for `options.objective` within its budget and floor, over the
    sub-fleets of `scenario`; without a goal in money, the search's plan. The plan's
    `search` section names the fleet and the objective; its evaluation is on the whole
    scenario, where the GPUs left out are idle."""
    if not options.needs_fleets:
        if solve is not None:
            return solve(scenario, options.search_options())
        return search_plan(scenario, options.search_options(), progress)
    started = time.monotonic()
    check_prices(scenario)
    fleets = sub_fleets(scenario, options.max_fleets)
    outcomes = plan_fleets(fleets, options.search_options(), mapper=mapper, progress=progress,
                           solve=solve)
    chosen = choose(outcomes, options)
    return on_whole_scenario(scenario, chosen, time.monotonic() - started, {
        "objective": options.objective.value, "fleet": chosen.label,
        "fleets_planned": len(fleets), "max_usd_per_hour": options.max_usd_per_hour,
        "min_samples_per_s": options.min_samples_per_s})


def on_whole_scenario(scenario: Scenario, chosen: FleetOutcome, wall_s: float,
                       search_extra: dict[str, Any]) -> PlanResult:
    assert chosen.result is not None, "only planned outcomes are chosen"
    result = chosen.result
    evaluation = evaluate(scenario, result.plan)
    used = {g for p in result.plan.pipelines for s in p.stages for g in s.gpus}
    unused = {f"{n.name}:{i}": result.unused_gpus.get(
        f"{n.name}:{i}", f"left out: the chosen fleet is {chosen.label}")
        for n in scenario.cluster.nodes for i in range(n.gpus) if f"{n.name}:{i}" not in used}
    document = result.plan.model_copy(update={
        "estimate": estimate_section(evaluation),
        "search": {**(getattr(result.plan, "search", None) or {}), **search_extra,
                   "wall_s": wall_s}})
    return replace(result, plan=document, evaluation=evaluation, unused_gpus=unused,
                   wall_s=wall_s)


# What-if fleets ---------------------------------------------------------------------------


class _Change(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NodesAdded(_Change):
    gpu_type: str = Field(min_length=1)
    nodes: int = Field(ge=1, le=100_000)
    gpus_per_node: int | None = Field(
        default=None, ge=1, le=1024,
        description="Default: as the type's first node in the cluster (required for a new type).")
    zone: str | None = None


class NodesRemoved(_Change):
    gpu_type: str = Field(min_length=1)
    nodes: int = Field(ge=1, le=100_000, description="Taken off the end of the type's nodes.")


class FleetVariant(_Change):
    """A change to the base fleet: nodes added or removed per type, links changed."""

    name: str | None = Field(default=None, max_length=200)
    add: list[NodesAdded] = Field(default_factory=list)
    remove: list[NodesRemoved] = Field(default_factory=list)
    remove_types: list[str] = Field(default_factory=list)
    inter_node: Link | None = None
    intra_node: dict[str, Link] = Field(default_factory=dict)

    def label(self) -> str:
        if self.name:
            return self.name
        parts = [f"+{a.gpu_type}:{a.nodes}x{a.gpus_per_node or '?'}" for a in self.add]
        parts += [f"-{r.gpu_type}:{r.nodes}" for r in self.remove]
        parts += [f"-{t}" for t in self.remove_types]
        if self.inter_node is not None:
            parts.append(f"inter-node {self.inter_node.bandwidth_gb_per_s:g} GB/s")
        parts += [f"{t} intra-node {link.bandwidth_gb_per_s:g} GB/s"
                  for t, link in self.intra_node.items()]
        return " ".join(parts) or "unchanged"


def apply_variant(scenario: Scenario, variant: FleetVariant) -> Scenario:
    """The scenario with the variant's changes, validated: `InvalidScenario` when a type is
    unknown, has no profiles, or would lose more nodes than it has."""
    problems: list[Problem] = []
    nodes = [n for n in scenario.cluster.nodes if n.gpu_type not in set(variant.remove_types)]
    for i, removed in enumerate(variant.remove):
        of_type = [n for n in nodes if n.gpu_type == removed.gpu_type]
        if removed.nodes > len(of_type):
            problems.append(Problem(path=f"remove[{i}].nodes", value=removed.nodes, message=(
                f"the fleet has {len(of_type)} {removed.gpu_type} node(s) left to remove")))
            continue
        dropped = {id(n) for n in of_type[len(of_type) - removed.nodes:]}
        nodes = [n for n in nodes if id(n) not in dropped]
    for i, added in enumerate(variant.add):
        nodes += _added_nodes(scenario, added, f"add[{i}]", problems)
    if problems:
        raise InvalidScenario(problems)
    cluster = scenario.cluster.model_copy(update={
        "nodes": nodes,
        "inter_node": variant.inter_node or scenario.cluster.inter_node,
        "intra_node": {**scenario.cluster.intra_node, **variant.intra_node}})
    if not nodes:
        raise InvalidScenario([Problem(path="cluster.nodes",
                                       message=f"variant {variant.label()!r} removes every node")])
    return parse_scenario(scenario.model_copy(update={"cluster": cluster}))


def _added_nodes(scenario: Scenario, added: NodesAdded, where: str,
                 problems: list[Problem]) -> list[Node]:
    if added.gpu_type not in scenario.gpu_types:
        problems.append(Problem(path=f"{where}.gpu_type", value=added.gpu_type, message=(
            f"not a GPU type of the scenario ({', '.join(sorted(scenario.gpu_types))}); "
            "add it to gpu_types with its profiles")))
        return []
    like = next((n for n in scenario.cluster.nodes if n.gpu_type == added.gpu_type), None)
    gpus = added.gpus_per_node or (None if like is None else like.gpus)
    if gpus is None:
        problems.append(Problem(path=f"{where}.gpus_per_node", message=(
            f"the cluster has no {added.gpu_type} node to copy; give gpus_per_node")))
        return []
    taken = {n.name for n in scenario.cluster.nodes}
    names = (f"{added.gpu_type}-{where}-{k}" for k in itertools.count())
    fresh = (name for name in names if name not in taken)
    zone = added.zone if added.zone is not None else (None if like is None else like.zone)
    return [Node(name=next(fresh), gpu_type=added.gpu_type, gpus=gpus, zone=zone,
                 nics=None if like is None or like.gpus != gpus else like.nics)
            for _ in range(added.nodes)]


@dataclass(frozen=True, kw_only=True)
class WhatIfRow:
    """One variant's plan against the base fleet's; deltas None where either side lacks
    the number."""

    name: str
    outcome: FleetOutcome
    samples_per_s: float | None = None
    usd_per_hour: float | None = None
    usd_per_million_tokens: float | None = None
    samples_per_s_change: float | None = None
    """Relative change against the base: 0.25 is 25 % faster."""
    usd_per_hour_change: float | None = None
    usd_per_million_tokens_change: float | None = None
    num_gpus: int = 0
    errors: list[str] = field(default_factory=list)

    def numbers(self) -> dict[str, Any]:
        """The row without its plan: name, GPUs, speed, price, changes, errors."""
        return {key: getattr(self, key) for key in (
            "name", "num_gpus", "samples_per_s", "usd_per_hour", "usd_per_million_tokens",
            "samples_per_s_change", "usd_per_hour_change", "usd_per_million_tokens_change",
            "errors")}


def _relative(value: float | None, base: float | None) -> float | None:
    if value is None or base is None or base == 0:
        return None
    return value / base - 1.0


def _row(name: str, fleet: Fleet, outcome: FleetOutcome, base: WhatIfRow | None) -> WhatIfRow:
    evaluation = None if outcome.result is None else outcome.result.evaluation
    sps = None if evaluation is None else evaluation.samples_per_s
    usd = None if evaluation is None else evaluation.usd_per_hour
    per_token = None if evaluation is None else evaluation.usd_per_million_tokens
    return WhatIfRow(
        name=name, outcome=outcome, samples_per_s=sps, usd_per_hour=usd,
        usd_per_million_tokens=per_token,
        samples_per_s_change=None if base is None else _relative(sps, base.samples_per_s),
        usd_per_hour_change=None if base is None else _relative(usd, base.usd_per_hour),
        usd_per_million_tokens_change=None if base is None
        else _relative(per_token, base.usd_per_million_tokens),
        num_gpus=fleet.scenario.cluster.num_gpus,
        errors=[] if outcome.error is None else [outcome.error])


def what_if(
    scenario: Scenario,
    variants: Sequence[FleetVariant],
    options: SearchOptions,
    *,
    mapper: Mapper[FleetTask, FleetOutcome] = map,
    progress: ProgressCallback | None = None,
    solve: Solve | None = None,
) -> list[WhatIfRow]:
    """The base fleet's row, then one per variant with its change against the base.
    Variants are checked before anything is planned (`InvalidScenario` for the first
    bad one, naming it)."""
    fleets = [Fleet(label="base", scenario=scenario)]
    for i, variant in enumerate(variants):
        try:
            fleets.append(Fleet(label=variant.label(), scenario=apply_variant(scenario, variant)))
        except InvalidScenario as error:
            raise InvalidScenario([replace(p, path=f"variants[{i}].{p.path}")
                                   for p in error.problems]) from None
    outcomes = plan_fleets(fleets, options, mapper=mapper, progress=progress, solve=solve)
    base = _row("base", fleets[0], outcomes[0], None)
    return [base] + [_row(f.label, f, o, base)
                     for f, o in zip(fleets[1:], outcomes[1:], strict=True)]

