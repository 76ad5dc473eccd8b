"""An upper bound on the samples/s of any plan, counting memory and gradient sync.

The compute bound (section 5) lets every GPU run the whole model at its best
point, with no sync. Here, for every number of pipelines n, three facts of
the cost model bound the iteration time of any plan with n pipelines:

- **Compute**: each sample crosses every layer once, on some GPU type at some
  profiled (b, tp) whose single-layer stage fits in memory, costing
  tp * (forward + backward) / b GPU-seconds there; a type's GPUs give at most
  their count of GPU-seconds per second. A pipeline has at most one stage per
  layer and a stage at most the largest tp, so at most n * L * tp_max GPUs
  work. A linear program (GLOP) gives the most samples per second.
- **Memory**: the used GPUs must hold n copies of every layer's state
  (section 4; ZeRO shards optimizer and gradients over the n copies).
- **Sync** (n >= 2): the stage holders of every layer hold, over all used
  GPUs, n * P parameters, so some GPU holds at least n * P / G_used and its
  ring moves 2(n-1)/n of its gradient bytes at no more than the fastest link
  its ring can have (a node's own link while n holders fit in one node, a link
  between nodes beyond).

Pipeline bubbles and transfers are left out, so the bound is loose where they
matter; it is valid for every plan of the version-1 space. Counts n are
taken one by one up to 8, then in ranges [2^k, 2^(k+1)) with each range's
most favourable terms, so a few dozen small linear programs cover thousands
of GPUs.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from planner.costs import GIB, ProfileIndex, state_bytes_per_param
from planner.documents import Scenario

__all__ = ["SpaceBound", "space_bound"]

ONE_BY_ONE = 8
"""Pipeline counts bounded one at a time; past this, in ranges [2^k, 2^(k+1))."""


@dataclass(frozen=True, kw_only=True)
class SpaceBound:
    iteration_s: float
    """No plan's iteration is shorter."""
    samples_per_s: float
    num_pipelines: tuple[int, int]
    """The range of pipeline counts where the bound is reached."""


def space_bound(scenario: Scenario) -> SpaceBound | None:
    """The bound, or None when no GPU type can hold any layer."""
    problem = _Problem(scenario)
    if not problem.costs:
        return None
    best: SpaceBound | None = None
    low = 1
    while low <= problem.num_gpus:
        high = low if low <= ONE_BY_ONE else min(2 * low - 1, problem.num_gpus)
        rate = problem.most_samples_per_s(most_gpus=high * problem.gpus_per_pipeline,
                                          fewest_pipelines=low)
        if rate > 0:
            seconds = scenario.job.global_batch_size / rate + problem.least_sync_s(low, high)
            if best is None or seconds < best.iteration_s:
                best = SpaceBound(iteration_s=seconds,
                                  samples_per_s=scenario.job.global_batch_size / seconds,
                                  num_pipelines=(low, high))
        low = high + 1
    return best


class _Problem:
    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.layers = scenario.model.layers
        self.params = [scenario.model.kinds[k].params for k in self.layers]
        self.gpus = Counter[str]()
        largest: Counter[str] = Counter()
        for node in scenario.cluster.nodes:
            self.gpus[node.gpu_type] += node.gpus
            largest[node.gpu_type] = max(largest[node.gpu_type], node.gpus)
        self.num_gpus = sum(self.gpus.values())
        self.largest_node = max(largest.values())
        profiles = ProfileIndex(scenario.profiles)
        # Per (layer kind, type): the least GPU-seconds per sample over points whose
        # single-layer stage fits beside the reserved memory (state counted unsharded: a
        # point that fails it may still fit under ZeRO with many pipelines, so sharded
        # state is used whenever the job shards).
        per_param = state_bytes_per_param(scenario, self.num_gpus).total
        self.costs: dict[tuple[str, str], float] = {}
        tps = [1]
        for point in profiles.points():
            gpu_type, kind, b, tp = point
            row = profiles.get(*point)
            if row is None or gpu_type not in self.gpus or kind not in set(self.layers):
                continue
            if tp > largest[gpu_type]:
                continue
            room = (scenario.gpu_types[gpu_type].memory_gib - scenario.reserved_gib(gpu_type)) * GIB
            if scenario.model.kinds[kind].params / tp * per_param + row.activation_bytes > room:
                continue
            cost = tp * (row.forward_ms + row.backward_ms) * 1e-3 / b
            key = (kind, gpu_type)
            self.costs[key] = min(cost, self.costs.get(key, cost))
            tps.append(tp)
        self.gpus_per_pipeline = len(self.layers) * max(tps)
        self._program: tuple[Any, Any, Any, Any] | None = None

    def most_samples_per_s(self, *, most_gpus: int, fewest_pipelines: int) -> float:
        """The compute and memory linear program for plans of at least `fewest_pipelines`
        pipelines on at most `most_gpus` GPUs. Built once; only two bounds change."""
        from ortools.linear_solver import pywraplp  # loaded only when a bound is asked for

        if self._program is None:
            self._program = self._build()
        solver, rate, gpu_cap, memory = self._program
        gpu_cap.SetUb(float(most_gpus))
        per_param = state_bytes_per_param(self.scenario, fewest_pipelines).total
        memory.SetLb(fewest_pipelines * sum(self.params) * per_param)
        if solver.Solve() != pywraplp.Solver.OPTIMAL:
            return 0.0
        # The solver's own tolerance could only overstate the rate by a hair: pad it.
        return float(rate.solution_value()) * (1 + 1e-7)

    def _build(self) -> tuple[Any, Any, Any, Any]:
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
        # A type's GPUs give at most their count of GPU-seconds per second.
        for t in self.gpus:
            seconds = solver.Constraint(-infinity, 0)
            seconds.SetCoefficient(used[t], -1)
            for layer, kind in enumerate(self.layers):
                if (layer, t) in flow:
                    seconds.SetCoefficient(flow[(layer, t)], self.costs[(kind, t)])
        # At most one stage per layer and pipeline, each at most the widest tp.
        gpu_cap = solver.Constraint(0, infinity)
        # The used GPUs hold every pipeline's copy of the state.
        memory = solver.Constraint(0, infinity)
        for t, u in used.items():
            gpu_cap.SetCoefficient(u, 1)
            memory.SetCoefficient(
                u, (scenario.gpu_types[t].memory_gib - scenario.reserved_gib(t)) * GIB)
        solver.Maximize(rate)
        return solver, rate, gpu_cap, memory

    def least_sync_s(self, low: int, high: int) -> float:
        """The least sync of any plan with `low` to `high` pipelines (0 for one pipeline)."""
        n = low
        if n <= 1:
            return 0.0
        cluster = self.scenario.cluster
        if n <= self.largest_node:  # every holder of a layer could sit on one node
            fastest = max(link.bandwidth_gb_per_s for link in
                          [*cluster.intra_node.values(), cluster.inter_node, *cluster.inter_zone])
        else:
            fastest = max(link.bandwidth_gb_per_s for link in [cluster.inter_node,
                                                               *cluster.inter_zone])
        used = min(self.num_gpus, high * self.gpus_per_pipeline)
        grad = self.scenario.job.grad_bytes  # all-reduced whatever ZeRO shards
        return 2 * (n - 1) * sum(self.params) * grad / (used * fastest * 1e9)
