"""An upper bound on the samples/s of any plan: compute, memory, sync, node crossings
and the pipeline fill.

The compute bound (section 5) lets every GPU run the whole model at its best
point, with no sync. Here, for every number of pipelines n and every count k
of node crossings the smallest pipeline is sure to make, facts of the cost
model bound the iteration time of any plan in that class:

- **Compute**: each sample crosses every layer once, on some GPU type at some
  profiled (b, tp) whose single-layer stage fits in memory, costing
  tp * (forward + backward) / b GPU-seconds there; a type's GPUs give at most
  their count of GPU-seconds per second. A pipeline has at most one stage per
  layer and a stage at most the largest tp, so at most n * L * tp_max GPUs
  work. A linear program (GLOP) gives the most samples per second.
- **Crossings**: a pipeline of G GPUs spans at least G / (largest node) nodes;
  each crossing between them is a blocking transfer charged to both stages,
  forward and backward. Every pipeline crosses at least k times, which the
  linear program charges per sample; and since each pipeline's rate is
  concave in its GPUs, equal pipelines give the most (a second cap).
- **Memory**: the used GPUs must hold n copies of every layer's state
  (section 4; ZeRO shards optimizer and gradients over the n copies).
- **Sync** (n >= 2): the smallest pipeline spreads the model over at most
  (k + 1) nodes' worth of GPUs and all of them over the used GPUs, so some GPU
  holds a share of the parameters and its ring moves 2(n-1)/n of its gradient
  bytes at no more than the fastest link its ring can have (a node's own link
  while n holders fit in one node, a link between nodes beyond).
- **Fill and drain** (1F1B and GPipe): the pipeline with the largest batch
  share takes at least a micro-batch's fastest traversal over the fraction of
  its stages a schedule can keep busy (least_pipeline_s).
- **Rings inside nodes** (2 <= n <= node size): a layer's ring stays on one node
  only where every pipeline holds that layer on the node where the smallest
  pipeline does. If D nodes hold such layers, every pipeline crosses at least
  D - 1 times and those D nodes compute the layers for every sample; the other
  layers sync between nodes (`_ring_classes`, `_Rings`).

What is left out (micro-batch size coupled to activation memory and to the
number of micro-batches, tp coupled to stage count) keeps the bound loose
where those decide, mostly on small fleets. It is valid for every plan of the
version-1 space and for the schedules it is given. Counts n are taken one by
one up to 8, then in ranges [2^k, 2^(k+1)) with each range's most favourable
terms, and crossing counts the same way; classes are taken in order of their time
without their own linear program, and those that cannot win are skipped.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import Counter
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any

from planner.costs import GIB, ProfileIndex, profile_index, state_bytes_per_param
from planner.documents import Scenario, Schedule

__all__ = ["SpaceBound", "space_bound"]

ONE_BY_ONE = 8
"""Pipeline counts bounded one at a time; past this, in ranges [2^k, 2^(k+1))."""
CROSSINGS_ONE_BY_ONE = 16
"""The same for node crossings: deep pipelines over slow links are where the bound is
decided, and a range prices crossings at its fewest and sync at its most."""
RING_NODES_ONE_BY_ONE = 4
"""Nodes holding the layers whose rings stay inside a node: one by one up to this many."""


@dataclass(frozen=True, kw_only=True)
class SpaceBound:
    iteration_s: float
    """No plan's iteration is shorter."""
    samples_per_s: float
    num_pipelines: tuple[int, int]
    """The range of pipeline counts where the bound is reached."""


def space_bound(scenario: Scenario,
                schedules: Collection[Schedule] | None = None) -> SpaceBound | None:
    """The bound over plans that run one of `schedules` (default: the job's), or None when
    no GPU type can hold any layer."""
    problem = _Problem(scenario, schedules or {scenario.job.schedule})
    if not problem.costs:
        return None
    batch = scenario.job.global_batch_size
    # Every class with its time before its own linear program (without crossings, capped):
    # a lower bound of its time, so the classes are taken best first and the rest skipped.
    classes = []
    for low, high in _counts(problem.num_gpus, start=1):
        most_gpus = high * problem.gpus_per_pipeline
        unhindered = problem.most_samples_per_s(most_gpus=most_gpus, fewest_pipelines=low,
                                                crossings=0)
        if unhindered <= 0:
            continue
        fill_s = problem.least_pipeline_s(batch / high)
        for crossings, most_crossings in _counts(problem.most_crossings(low), start=0,
                                                   one_by_one=CROSSINGS_ONE_BY_ONE):
            sync_s = problem.least_sync_s(low, high, most_crossings)
            for charged, rings in _ring_classes(problem, low, crossings, most_crossings, sync_s):
                capped = min(unhindered, problem.most_with_crossings(high, charged))
                classes.append((rings.least_s(max(batch / capped, fill_s)), low, high, charged,
                                capped, fill_s, rings))
    best: SpaceBound | None = None
    for optimistic, low, high, crossings, capped, fill_s, rings in sorted(
            classes, key=lambda c: c[:4]):
        if best is not None and optimistic * (1 - 1e-9) >= best.iteration_s:
            break
        rate = capped if crossings == 0 else min(capped, problem.most_samples_per_s(
            most_gpus=high * problem.gpus_per_pipeline, fewest_pipelines=low,
            crossings=crossings))
        if rate <= 0:
            continue
        # Where a term is tight it may round a hair above the estimator's own sums.
        seconds = rings.least_s(max(batch / rate, fill_s)) * (1 - 1e-9)
        if best is None or seconds < best.iteration_s:
            best = SpaceBound(iteration_s=seconds, samples_per_s=batch / seconds,
                              num_pipelines=(low, high))
    return best


def _counts(most: int, *, start: int, one_by_one: int = ONE_BY_ONE
            ) -> Iterator[tuple[int, int]]:
    """Ranges [low, high] covering start..most: one by one up to `one_by_one`, then
    doubling."""
    low = start
    while low <= most:
        high = low if low <= one_by_one else min(2 * low - 1, most)
        yield low, high
        low = high + 1


class _Problem:
    def __init__(self, scenario: Scenario, schedules: Collection[Schedule]) -> None:
        self.scenario = scenario
        # Interleaving starts a stage after its neighbours' first chunks only, and a local
        # backward waits for nothing: the fill and drain argument holds for these two.
        self.fills_and_drains = set(schedules) <= {Schedule.ONE_F_ONE_B, Schedule.GPIPE}
        self.layers = scenario.model.layers
        self.params = [scenario.model.kinds[k].params for k in self.layers]
        self.gpus = scenario.cluster.gpus_per_type
        largest: Counter[str] = Counter()
        for node in scenario.cluster.nodes:
            largest[node.gpu_type] = max(largest[node.gpu_type], node.gpus)
        self.num_gpus = scenario.cluster.num_gpus
        self.num_nodes = len(scenario.cluster.nodes)
        self.largest_node = max(largest.values())
        profiles = profile_index(scenario)
        self.costs, widest = _least_costs(scenario, profiles, largest)
        self.gpus_per_pipeline = len(self.layers) * widest
        self.crossing_s = _crossing_gpu_s_per_sample(scenario, profiles)
        self.traversal_s = _least_traversal_s(scenario, profiles, largest)
        least = [min((cost for (k, _), cost in self.costs.items() if k == kind), default=math.inf)
                 for kind in self.layers]
        self.least_compute_s = sum(least)  # infinite where some layer fits nowhere
        self._program: tuple[Any, Any, Any, Any, Any] | None = None
        self._solved: dict[tuple[int, int, int], float] = {}
        cluster = scenario.cluster
        self.between_nodes_bytes_per_s = 1e9 * max(
            link.bandwidth_gb_per_s for link in [cluster.inter_node, *cluster.inter_zone])
        self.total_params = float(sum(self.params))
        self.knapsack = _Knapsack.of(self.params, least)

    def most_with_crossings(self, most_pipelines: int, crossings: int) -> float:
        """Samples/s of at most `most_pipelines` pipelines that each cross between nodes at
        least `crossings` times and once per node they fill beyond the first.

        A pipeline of G GPUs spans at least G / (largest node) nodes, so with the model's
        least compute c per sample (each layer on its cheapest type) it runs at most
        f(G) = G / (c + crossing cost * max(crossings, G / node - 1)) samples/s. Where a
        crossing costs more than c, f falls past (crossings + 1) nodes' worth of GPUs;
        capped there it is concave in G, so equal pipelines sharing the GPUs do best, and
        more of them do better."""
        n = most_pipelines
        share = min(self.num_gpus, n * self.gpus_per_pipeline) / n
        if self.crossing_s > self.least_compute_s:
            share = min(share, (crossings + 1) * self.largest_node)
        spans = max(crossings, share / self.largest_node - 1)
        return n * share / (self.least_compute_s + self.crossing_s * spans)

    def least_pipeline_s(self, samples: float) -> float:
        """The least time of a 1F1B or GPipe pipeline that runs at least `samples` samples.

        Stage k is busy m W_k, and starts after stages 0..k-1 run their first forward and
        ends before they run their last backward: T >= m W_k + sum_(j<k) W_j for every k.
        The per-micro-batch times W that make all these tight (W_k = W_0 (1 - 1/m)^k) give
        the least T for their sum: W / (1 - (1 - 1/m)^S), at most L stages."""
        if not self.fills_and_drains:
            return 0.0
        stages = len(self.layers)
        return min(traversal / (1 - max(0.0, 1 - b / samples) ** stages)
                   for b, traversal in self.traversal_s.items())

    def most_crossings(self, fewest_pipelines: int) -> int:
        """The most node crossings the smallest pipeline is sure to make, when there are at
        least `fewest_pipelines` pipelines (it has at most its share of the GPUs)."""
        return max(0, -(-self.smallest_gpus(fewest_pipelines, None) // self.largest_node) - 1)

    def smallest_gpus(self, fewest_pipelines: int, crossings: int | None) -> int:
        """The most GPUs the smallest pipeline has, with at least `fewest_pipelines`
        pipelines and, where given, at most `crossings` crossings that its size forces."""
        most = min(self.gpus_per_pipeline, self.num_gpus // fewest_pipelines)
        return most if crossings is None else min(most, (crossings + 1) * self.largest_node)

    def most_samples_per_s(self, *, most_gpus: int, fewest_pipelines: int,
                           crossings: int) -> float:
        """The compute and memory linear program for plans of at least `fewest_pipelines`
        pipelines on at most `most_gpus` GPUs, each pipeline crossing between nodes at least
        `crossings` times. Built once; only three coefficients change."""
        from ortools.linear_solver import pywraplp  # loaded only when a bound is asked for

        # Classes of pipelines and crossings often ask the same program (no more GPUs than
        # there are): solved once.
        key = (min(most_gpus, self.num_gpus), fewest_pipelines, crossings)
        known = self._solved.get(key)
        if known is not None:
            return known
        if self._program is None:
            self._program = self._build()
        solver, rate, gpu_cap, memory, busy = self._program
        gpu_cap.SetUb(float(key[0]))
        busy.SetCoefficient(rate, crossings * self.crossing_s)
        per_param = state_bytes_per_param(self.scenario, fewest_pipelines).total
        memory.SetLb(fewest_pipelines * self.total_params * per_param)
        if solver.Solve() != pywraplp.Solver.OPTIMAL:
            found = 0.0
        else:
            # The solver's own tolerance could only overstate the rate by a hair: pad it.
            found = float(rate.solution_value()) * (1 + 1e-7)
        self._solved[key] = found
        return found

    def _build(self) -> tuple[Any, Any, Any, Any, Any]:
        from ortools.linear_solver import pywraplp

        scenario = self.scenario
        solver = pywraplp.Solver.CreateSolver("GLOP")
        infinity = solver.infinity()
        # Variables: samples/s of each layer on each type, GPUs of each type used, rate.
        rate = solver.NumVar(0, infinity, "rate")
        used = {t: solver.NumVar(0, n, f"used[{t}]") for t, n in self.gpus.items()}
        flow = {(layer, t): solver.NumVar(0, infinity, f"flow[{layer},{t}]")
                for layer, kind in enumerate(self.layers) for t in self.gpus
                if (kind, t) in self.costs}
        # Every layer carries every sample.
        for layer in range(len(self.layers)):
            carried = solver.Constraint(0, 0)
            carried.SetCoefficient(rate, -1)
            for t in self.gpus:
                if (layer, t) in flow:
                    carried.SetCoefficient(flow[(layer, t)], 1)
        # A type's GPUs give at most their count of GPU-seconds per second; all used GPUs
        # together also carry every sample's blocking transfers between nodes (`busy`: the
        # rate's coefficient is set per count of crossings).
        busy = solver.Constraint(-infinity, 0)
        for t in self.gpus:
            seconds = solver.Constraint(-infinity, 0)
            for constraint in (seconds, busy):
                constraint.SetCoefficient(used[t], -1)
                for layer, kind in enumerate(self.layers):
                    if (layer, t) in flow:
                        constraint.SetCoefficient(flow[(layer, t)], self.costs[(kind, t)])
        # At most one stage per layer and pipeline, each at most the widest tp.
        gpu_cap = solver.Constraint(0, infinity)
        # The used GPUs hold every pipeline's copy of the state.
        memory = solver.Constraint(0, infinity)
        for t, u in used.items():
            gpu_cap.SetCoefficient(u, 1)
            memory.SetCoefficient(
                u, (scenario.gpu_types[t].memory_gib - scenario.reserved_gib(t)) * GIB)
        solver.Maximize(rate)
        return solver, rate, gpu_cap, memory, busy

    def least_sync_s(self, low: int, high: int, crossings: int) -> float:
        """The least sync of any plan with `low` to `high` pipelines whose smallest pipeline
        crosses between nodes no more than `crossings` times (0 for one pipeline)."""
        n = low
        if n <= 1:
            return 0.0
        fastest = self.between_nodes_bytes_per_s
        if n <= self.largest_node:  # every holder of a layer could sit on one node
            fastest = max(fastest, 1e9 * max(link.bandwidth_gb_per_s
                                             for link in self.scenario.cluster.intra_node.values()))
        # The smallest pipeline spreads the model over at most `smallest` GPUs, and all
        # pipelines together over at most `used`: some GPU holds the larger share.
        smallest = self.smallest_gpus(low, crossings)
        used = min(self.num_gpus, high * self.gpus_per_pipeline)
        held = self.total_params * max(1 / smallest, n / used)
        grad = self.scenario.job.grad_bytes  # all-reduced whatever ZeRO shards
        return 2 * (n - 1) / n * held * grad / fastest


def _least_costs(scenario: Scenario, profiles: ProfileIndex, largest: Counter[str]
                 ) -> tuple[dict[tuple[str, str], float], int]:
    """Per (layer kind, type): the least GPU-seconds per sample over points whose
    single-layer stage fits beside the reserved memory; and the widest tp among them (1 at
    least). State is counted sharded whenever the job shards, over every GPU: a point that
    fails unsharded may still fit under ZeRO with many pipelines."""
    per_param = state_bytes_per_param(scenario, scenario.cluster.num_gpus).total
    kinds = set(scenario.model.layers)
    costs: dict[tuple[str, str], float] = {}
    widest = 1
    for point in profiles.points():
        gpu_type, kind, b, tp = point
        row = profiles.get(*point)
        if row is None or gpu_type not in largest or kind not in kinds:
            continue
        if tp > largest[gpu_type]:
            continue
        room = (scenario.gpu_types[gpu_type].memory_gib - scenario.reserved_gib(gpu_type)) * GIB
        if scenario.model.kinds[kind].params / tp * per_param + row.activation_bytes > room:
            continue
        cost = tp * (row.forward_ms + row.backward_ms) * 1e-3 / b
        costs[(kind, gpu_type)] = min(cost, costs.get((kind, gpu_type), cost))
        widest = max(widest, tp)
    return costs, widest


@dataclass(frozen=True, kw_only=True)
class _Knapsack:
    """Layers by parameters per least GPU-second (a fractional knapsack's order), with
    cumulative compute and parameters: the most parameters that much compute holds."""

    compute: list[float]
    """Cumulative least compute of the layers in order (0 first)."""
    params: list[float]
    """Cumulative parameters of the same layers."""
    densities: list[float]
    """Each layer's parameters per GPU-second, negated (ascending)."""

    @staticmethod
    def of(params: list[int], least: list[float]) -> _Knapsack:
        """The knapsack of the layers of `params` whose least compute `least` is finite."""
        ordered = sorted((layer for layer in range(len(params)) if math.isfinite(least[layer])),
                         key=lambda layer: -params[layer] / least[layer]
                         if least[layer] > 0 else -math.inf)
        return _Knapsack(
            compute=list(itertools.accumulate((least[layer] for layer in ordered), initial=0.0)),
            params=list(itertools.accumulate((float(params[layer]) for layer in ordered),
                                             initial=0.0)),
            densities=[-params[layer] / least[layer] if least[layer] > 0 else -math.inf
                       for layer in ordered])

    def params_within(self, compute_s: float) -> float:
        """The most parameters of layers whose compute (each at its least GPU-seconds per
        sample, a layer counted in part for part of its compute) adds up to `compute_s`."""
        cumulative, params = self.compute, self.params
        j = bisect.bisect_right(cumulative, compute_s) - 1
        if j >= len(cumulative) - 1:
            return params[-1]
        share = (compute_s - cumulative[j]) / (cumulative[j + 1] - cumulative[j])
        return params[j] + share * (params[j + 1] - params[j])

    def compute_above_density(self, density: float) -> float:
        """The compute of the layers holding more than `density` parameters per GPU-second
        (the knapsack's first ones)."""
        return self.compute[bisect.bisect_left(self.densities, -density)]

    def compute_holding(self, held: float) -> float:
        """The least compute whose layers hold `held` parameters (`params_within`'s
        inverse)."""
        cumulative, params = self.compute, self.params
        j = bisect.bisect_left(params, held)
        if j >= len(params):
            return math.inf
        if j == 0:
            return 0.0
        share = (held - params[j - 1]) / (params[j] - params[j - 1])
        return cumulative[j - 1] + share * (cumulative[j] - cumulative[j - 1])


def _ring_classes(problem: _Problem, low: int, crossings: int, most_crossings: int,
                  sync_s: float) -> Iterator[tuple[int, _Rings]]:
    """The crossings every pipeline makes at least, with the rings' term, of the plans of a
    class (`low` or more pipelines; the smallest one's size forcing `crossings` to
    `most_crossings` crossings), split by D, the number of nodes holding the layers whose
    rings stay inside a node. Those rings need every pipeline's holder of their layer on
    the node where the smallest pipeline holds it, so every pipeline visits all D nodes
    (at least D - 1 crossings, which its size may already force) and those nodes compute
    the layers for every sample. Without a node's worth of pipelines or fewer, no ring
    stays inside a node beyond what `least_sync_s` counts: one class."""
    if not 2 <= low <= problem.largest_node:
        yield crossings, _Rings(problem, sync_s)
        return
    smallest = problem.smallest_gpus(low, most_crossings)
    most_nodes = min(smallest, problem.num_nodes)  # each a node of the smallest pipeline
    first = min(crossings + 1, most_nodes)  # no more crossings than its size forces
    yield crossings, _Rings(problem, sync_s, low=low, smallest=smallest, nodes=first)
    for nodes_low, nodes in _counts(most_nodes, start=first + 1, one_by_one=RING_NODES_ONE_BY_ONE):
        # Charged as the crossing counts of the classes above (at most D - 1): the same
        # linear programs, solved once.
        yield _crossings_floor(nodes_low - 1), _Rings(problem, sync_s, low=low,
                                                      smallest=smallest, nodes=nodes)


def _crossings_floor(crossings: int) -> int:
    """The largest crossing count at most `crossings` that starts a range of the classes'
    crossing counts (`_counts`)."""
    return max(low for low, _ in _counts(crossings, start=0, one_by_one=CROSSINGS_ONE_BY_ONE))


class _Rings:
    """The least iteration of plans whose pipelines take at least a given time t0: that time
    plus their least sync. Sync is at least `sync_s`; and where the layers whose rings stay
    inside a node are computed on at most `nodes` nodes, in a pipeline time t those nodes
    give at most (their GPUs x t) GPU-seconds, so those layers hold at most the parameters
    a fractional knapsack packs into that compute (each layer at its least GPU-seconds per
    sample). The other layers sync between nodes, spread over at most the smallest
    pipeline's GPUs. A longer pipeline time lets more rings stay inside: the least total is
    a minimum over t >= t0 of a convex, piecewise linear function, read at its
    breakpoints."""

    def __init__(self, problem: _Problem, sync_s: float, *, low: int = 1, smallest: int = 1,
                 nodes: int = 0) -> None:
        self.problem = problem
        self.sync_s = sync_s
        self.inside_gpus = min(problem.num_gpus, nodes * problem.largest_node)
        # Sync seconds per parameter whose ring leaves a node (none with one pipeline).
        self.per_param_s = 0.0 if low < 2 else (
            2 * (low - 1) / low * problem.scenario.job.grad_bytes
            / (smallest * problem.between_nodes_bytes_per_s))

    def least_s(self, pipeline_s: float) -> float:
        problem, batch = self.problem, self.problem.scenario.job.global_batch_size
        if self.per_param_s <= 0 or not math.isfinite(pipeline_s):
            return pipeline_s + self.sync_s
        if self.inside_gpus <= 0:  # no ring stays inside a node
            return pipeline_s + max(self.sync_s, self.per_param_s * problem.total_params)
        # t + per_param_s x (parameters whose rings leave a node at t) falls while the
        # knapsack's next layer holds more than batch / (per_param_s x inside GPUs)
        # parameters per GPU-second, and the other term stops it where the two meet: the
        # least is at the first of those two times, or at the least time given.
        enough = problem.total_params - self.sync_s / self.per_param_s
        if enough <= 0:  # the rings that leave a node never sync longer than `sync_s`
            return pipeline_s + self.sync_s
        per_gpu_s = self.inside_gpus / batch
        knapsack = problem.knapsack
        turn = min(knapsack.compute_above_density(1 / (self.per_param_s * per_gpu_s)),
                   knapsack.compute_holding(enough)) / per_gpu_s
        t = max(pipeline_s, turn)
        return t + max(self.sync_s, self.per_param_s * (
            problem.total_params - knapsack.params_within(per_gpu_s * t)))


def _least_traversal_s(scenario: Scenario, profiles: ProfileIndex,
                       largest_node: Counter[str]) -> dict[int, float]:
    """Per micro-batch size: the least time one micro-batch takes forward and backward
    through every layer, each layer at its fastest type and tp within the type's largest
    node (transfers left out)."""
    fastest: dict[tuple[int, str], float] = {}
    for point in profiles.points():
        gpu_type, kind, b, tp = point
        row = profiles.get(*point)
        if row is None or tp > largest_node[gpu_type]:
            continue
        seconds = (row.forward_ms + row.backward_ms) * 1e-3
        fastest[(b, kind)] = min(seconds, fastest.get((b, kind), seconds))
    sizes = {b for b, _ in fastest}
    return {b: sum(fastest[(b, kind)] for kind in scenario.model.layers) for b in sizes
            if all((b, kind) in fastest for kind in scenario.model.layers)}


def _crossing_gpu_s_per_sample(scenario: Scenario, profiles: ProfileIndex) -> float:
    """GPU-seconds that one crossing between two nodes adds to each sample of a pipeline
    at least. A blocking transfer occupies sender and receiver (section 3), forward and
    backward (a local schedule sends nothing backward); it takes at least latency / the
    largest micro-batch plus the smallest boundary output over the fastest link."""
    if not scenario.job.blocking_transfers:
        return 0.0
    cluster = scenario.cluster
    links = [cluster.inter_node, *cluster.inter_zone]
    kinds = scenario.model.kinds
    boundary_bytes = min((kinds[k].output_bytes_per_sample for k in scenario.model.layers[:-1]),
                         default=0.0)
    largest_batch = max(point[2] for point in profiles.points())
    one_way = (min(link.latency_us for link in links) * 1e-6 / largest_batch
               + boundary_bytes / (max(link.bandwidth_gb_per_s for link in links) * 1e9))
    charges = 2 if scenario.job.schedule is Schedule.LOCAL else 4
    return charges * one_way
