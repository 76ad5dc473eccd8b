"""Exact mode: the proven optimum of a small scenario, by branch and bound.

The version-1 plan space is enumerated here without the search's templates,
layer-split DP or allocation, so that it does not share their blind spots:
- A **structure** is a micro-batch size and a sequence of stages, each a node,
  a profiled tp (its GPUs inside that node) and a contiguous layer range. The
  GPUs of one node are interchangeable (links and interfaces belong to nodes),
  so a structure fixes everything the cost model reads of a pipeline but its
  number of micro-batches. Every sequence of (node, tp) that fits the nodes,
  every contiguous split and every micro-batch size profiled for all its
  stages is one.
- A **plan** is a multiset of structures that fits the nodes, with a batch
  share each; GPUs left out are idle.

For a multiset, the least pipeline time over all batch shares is exact: the
candidate times are the simulated times of each pipeline for each number of
micro-batches, and a time is reachable when the batch is a sum of
`b_p * m_p` with each `m_p` between 1 and what pipeline p finishes by then.

The branch and bound adds structures in a fixed order (a multiset is met
once) and drops a partial plan when a lower bound on every plan that extends
it is no better than the best found (the default search's plan to start):
- sync time: it only grows as pipelines are added (the factor 2(n-1)/n and
  the latency steps grow, the rings' bandwidth can only be at most what an
  extension leaves it, and interfaces are shared by more GPUs);
- pipeline time: at least the least time at which the chosen pipelines
  (timed by a lower bound of the event simulation), and every free GPU at the
  most samples per GPU any structure finishes by then, cover the batch.

Limits: scenarios with at most `MAX_GPUS` GPUs, `MAX_LAYERS` layers and
`MAX_STRUCTURES` structures, and at most two zones (with three or more, the
order of pipelines in a sync ring can change its slowest hop, and only one
order is tried). Larger inputs are refused before anything is enumerated.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from planner.costs import GIB, link_between, profile_index, state_bytes_per_param
from planner.documents import Node, Pipeline, Plan, Scenario, Schedule, Stage
from planner.errors import PlannerError
from planner.estimate import Evaluation, evaluate
from planner.simulate import simulate_pipeline

__all__ = ["MAX_GPUS", "MAX_LAYERS", "MAX_STRUCTURES", "ExactResult", "TooLargeForExact",
           "exact_optimum"]

MAX_GPUS = 16
MAX_LAYERS = 16
MAX_STRUCTURES = 400_000
BISECTIONS = 40
SEEDS = 4096
"""Structures, most promising first, whose replicas are judged before the enumeration."""


class TooLargeForExact(PlannerError):
    pass


@dataclass(frozen=True, kw_only=True)
class ExactResult:
    plan: Plan
    evaluation: Evaluation
    proven: bool
    """False when the deadline stopped the enumeration before it finished."""
    num_structures: int
    num_plans: int
    """Partial plans the branch and bound looked at."""


ExactProgress = Callable[[float, str], None]


def exact_optimum(
    scenario: Scenario,
    *,
    incumbent: Plan | None = None,
    deadline: float | None = None,
    progress: ExactProgress | None = None,
) -> ExactResult | None:
    """The best plan of the whole version-1 space (None if no plan is valid). `incumbent`,
    a valid plan, starts the bound; `deadline` (time.monotonic()) stops the enumeration
    early, with `proven` false; `progress` may raise to cancel."""
    check_size(scenario)
    best_s = math.inf
    best_plan: Plan | None = None
    if incumbent is not None:
        judged = evaluate(scenario, incumbent)
        if judged.valid and judged.iteration_s is not None:
            best_s, best_plan = judged.iteration_s, incumbent
    try:
        structures = _Enumeration(scenario).structures(deadline)
    except _Cancelled:
        structures = None
    search = None
    if structures is not None:
        search = _BranchAndBound(scenario, structures, best_s, deadline, progress)
        best_plan = search.run() or best_plan
    if best_plan is None:
        return None
    return ExactResult(plan=best_plan, evaluation=evaluate(scenario, best_plan),
                       proven=search is not None and not search.stopped,
                       num_structures=len(structures or ()),
                       num_plans=0 if search is None else search.visited)


def check_size(scenario: Scenario) -> None:
    """Refuse, naming the limit, a scenario too large to enumerate."""
    gpus = scenario.cluster.num_gpus
    layers = len(scenario.model.layers)
    zones = {n.zone for n in scenario.cluster.nodes if n.zone is not None}
    if gpus > MAX_GPUS:
        raise TooLargeForExact(f"exact mode enumerates at most {MAX_GPUS} GPUs and this "
                               f"cluster has {gpus}; use the default search")
    if layers > MAX_LAYERS:
        raise TooLargeForExact(f"exact mode enumerates at most {MAX_LAYERS} layers and this "
                               f"model has {layers}; use the default search")
    if len(zones) > 2:
        raise TooLargeForExact(f"exact mode handles at most 2 zones and this cluster has "
                               f"{len(zones)}; use the default search")
    count = _Enumeration(scenario).count()
    if count > MAX_STRUCTURES:
        raise TooLargeForExact(
            f"exact mode enumerates at most {MAX_STRUCTURES} pipeline structures and this "
            f"scenario has {count}; use the default search, or fewer GPUs, layers or "
            "profiled points")


@dataclass(eq=False, slots=True)
class _Structure:
    micro_batch: int
    stages: tuple[tuple[int, int, int, int], ...]
    """(node index, tp, first layer, end layer) per stage."""
    usage: tuple[int, ...]
    """GPUs used on each node."""
    times: np.ndarray
    """Per stage, forward and backward seconds (rows 0 and 1), then the transfer to the next
    stage (row 2, the last column 0): a view into its skeleton's arrays, read only when the
    structure's pipeline is simulated."""
    most_micro_batches: int
    """Most micro-batches with which every stage fits in memory (and the batch allows)."""
    lower_s: np.ndarray
    """A lower bound of the pipeline's time for m = 1, 2, ... micro-batches (index m - 1)."""
    node_of_layer: tuple[int, ...]
    """Per layer, the node of the stage that holds it."""
    slowest_s: float
    """The slowest stage's forward plus backward: what each more micro-batch adds at least."""
    exact_s: dict[int, float] = field(default_factory=dict)

    @property
    def num_gpus(self) -> int:
        return sum(self.usage)


class _Enumeration:
    """Every structure of a scenario, with its stage times and memory limit."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.nodes = scenario.cluster.nodes
        self.layers = scenario.model.layers
        self.num_layers = len(self.layers)
        self.batch = scenario.job.global_batch_size
        self.schedule = scenario.job.schedule
        profiles = profile_index(scenario)
        kinds = set(self.layers)
        self.points: dict[str, list[tuple[int, int]]] = {
            t: profiles.complete_points(t, kinds) for t in {n.gpu_type for n in self.nodes}}
        self.profiles = profiles
        self._prefixes: dict[tuple[str, int, int], np.ndarray] = {}
        self._holds: dict[tuple[str, int, int], np.ndarray] = {}
        self.params = np.concatenate(([0.0], np.cumsum([scenario.model.kinds[k].params
                                                        for k in self.layers])))
        self.output_bytes = np.array([scenario.model.kinds[k].output_bytes_per_sample
                                      for k in self.layers], dtype=float)

    def options(self) -> list[tuple[int, int]]:
        """(node index, tp) a stage may take."""
        return [(i, tp) for i, node in enumerate(self.nodes)
                for tp in sorted({tp for _, tp in self.points[node.gpu_type]}) if tp <= node.gpus]

    def skeletons(self) -> Iterator[tuple[tuple[int, int], ...]]:
        """Every sequence of (node, tp) that fits the nodes, at most one stage per layer."""
        options = self.options()
        used = [0] * len(self.nodes)
        sequence: list[tuple[int, int]] = []

        def extend() -> Iterator[tuple[tuple[int, int], ...]]:
            if sequence:
                yield tuple(sequence)
            if len(sequence) == self.num_layers:
                return
            for i, tp in options:
                if used[i] + tp <= self.nodes[i].gpus:
                    used[i] += tp
                    sequence.append((i, tp))
                    yield from extend()
                    sequence.pop()
                    used[i] -= tp

        yield from extend()

    def sizes(self, skeleton: Sequence[tuple[int, int]]) -> list[int]:
        """Micro-batch sizes profiled for every stage of the skeleton."""
        common: set[int] | None = None
        for i, tp in skeleton:
            have = {b for b, t in self.points[self.nodes[i].gpu_type] if t == tp}
            common = have if common is None else common & have
        return sorted(b for b in (common or set()) if b <= self.batch)

    def count(self) -> int:
        return sum(math.comb(self.num_layers - 1, len(s) - 1) * len(self.sizes(s))
                   for s in self.skeletons())

    def structures(self, deadline: float | None = None) -> list[_Structure]:
        splits = {depth: np.array([(0, *cuts, self.num_layers) for cuts in itertools.combinations(
            range(1, self.num_layers), depth - 1)], dtype=int).reshape(-1, depth + 1)
            for depth in range(1, self.num_layers + 1)}
        found: list[_Structure] = []
        for skeleton in self.skeletons():
            if deadline is not None and time.monotonic() > deadline:
                raise _Cancelled
            for b in self.sizes(skeleton):
                found.extend(self._structures(skeleton, b, splits[len(skeleton)]))
        return found

    def _prefix(self, gpu_type: str, b: int, tp: int) -> np.ndarray:
        """Prefix sums over layers of forward ms, backward ms and activation bytes (rows)."""
        key = (gpu_type, b, tp)
        if key not in self._prefixes:
            rows = [self.profiles.get(gpu_type, kind, b, tp) for kind in self.layers]
            values = np.array([(r.forward_ms, r.backward_ms, r.activation_bytes)
                               for r in rows if r is not None], dtype=float).T
            self._prefixes[key] = np.concatenate((np.zeros((3, 1)), np.cumsum(values, axis=1)),
                                                 axis=1)
        return self._prefixes[key]

    def _structures(
        self, skeleton: Sequence[tuple[int, int]], b: int, bounds: np.ndarray
    ) -> list[_Structure]:
        """The structures of one skeleton and micro-batch size, one per split (rows of
        `bounds`) with every stage fitting at least one micro-batch."""
        scenario, nodes = self.scenario, self.nodes
        depth, count = len(skeleton), len(bounds)
        starts, ends = bounds[:, :-1], bounds[:, 1:]
        forward_ms, backward_ms = np.empty((count, depth)), np.empty((count, depth))
        for s, (i, tp) in enumerate(skeleton):
            prefix = self._prefix(nodes[i].gpu_type, b, tp)[:2]  # activations: see _held
            forward_ms[:, s], backward_ms[:, s] = prefix[:, ends[:, s]] - prefix[:, starts[:, s]]
        transfers = np.zeros((count, depth - 1))
        for s in range(depth - 1):
            link = link_between(scenario, nodes[skeleton[s][0]], nodes[skeleton[s + 1][0]])
            transfers[:, s] = (link.latency_us * 1e-6 + self.output_bytes[ends[:, s] - 1] * b
                               / (link.bandwidth_gb_per_s * 1e9))
        blocking = scenario.job.blocking_transfers
        around = np.zeros((count, depth))
        if blocking:
            around[:, 1:] += transfers
            around[:, :-1] += transfers
        forward = (forward_ms + around * 1e3) * 1e-3
        backward = (backward_ms + around * 1e3) * 1e-3
        most = self._most_micro_batches(skeleton, b, starts, ends)
        lower = _lower_bounds(forward, backward, None if blocking else transfers,
                              self.batch // b)
        counts = [0] * len(nodes)
        for i, tp in skeleton:
            counts[i] += tp
        usage = tuple(counts)
        rows = np.flatnonzero(most >= 1)
        # Per structure, the node holding each layer and the slowest stage, for all at once.
        stage_of_layer = (np.arange(self.num_layers)[None, None, :]
                          >= bounds[rows, 1:-1][:, :, None]).sum(axis=1)
        node_of_layer = np.array([i for i, _ in skeleton])[stage_of_layer].tolist()
        slowest = (forward[rows] + backward[rows]).max(axis=1).tolist()
        node_ids, tps = [i for i, _ in skeleton], [tp for _, tp in skeleton]
        stages = [tuple(zip(node_ids, tps, row[:-1], row[1:], strict=True))
                  for row in bounds[rows].tolist()]
        times = np.stack((forward, backward, np.pad(transfers, ((0, 0), (0, 1)))), axis=1)
        return [
            _Structure(micro_batch=b, stages=stage, usage=usage, times=times[k],
                       most_micro_batches=m, lower_s=lower[k, :m], node_of_layer=tuple(nol),
                       slowest_s=slow)
            for k, stage, m, nol, slow in zip(
                rows.tolist(), stages, most[rows].tolist(), node_of_layer, slowest, strict=True)]

    def _most_micro_batches(self, skeleton: Sequence[tuple[int, int]], b: int, starts: np.ndarray,
                            ends: np.ndarray) -> np.ndarray:
        """Per split, the most micro-batches with which every stage fits by section 4's test
        (sharded state counted at the most pipelines the cluster could hold, so that no
        structure some plan needs is dropped; the plan chosen is checked by the estimator)."""
        limit = self.batch // b
        depth = len(skeleton)
        most = np.full(len(starts), limit)
        for s, (i, tp) in enumerate(skeleton):
            k = self._held(self.nodes[i].gpu_type, b, tp)[starts[:, s], ends[:, s]]
            needed = depth - s if self.schedule is Schedule.ONE_F_ONE_B else limit
            # 1F1B keeps at most S - s micro-batches in flight here: past that, any m fits.
            most = np.minimum(most, np.where(k >= needed, limit, k))
        return most.astype(int)

    def _held(self, gpu_type: str, b: int, tp: int) -> np.ndarray:
        """Per layer range [start, end) (rows, columns), the most micro-batches (at most the
        batch's) whose activations a stage of this type, size and tp holds beside its state;
        -1 where even the state does not fit. Built once per point: skeletons share them."""
        key = (gpu_type, b, tp)
        if key in self._holds:
            return self._holds[key]
        scenario = self.scenario
        limit = self.batch // b
        per_param = state_bytes_per_param(scenario, scenario.cluster.num_gpus).total
        state = (self.params[None, :] - self.params[:, None]) / tp * per_param
        prefix_acts = self._prefix(gpu_type, b, tp)[2]
        a = prefix_acts[None, :] - prefix_acts[:, None]
        reserved = scenario.reserved_gib(gpu_type) * GIB
        capacity = scenario.gpu_types[gpu_type].memory_gib * GIB

        def fits(k: np.ndarray) -> np.ndarray:
            return state + k * a + reserved <= capacity

        with np.errstate(divide="ignore", invalid="ignore"):
            k = np.where(a > 0, np.floor((capacity - reserved - state) / np.where(a > 0, a, 1)),
                         limit)
        k = np.clip(k, -1, limit)
        k = np.where((k >= 0) & ~fits(k), k - 1, k)  # settle the division's rounding
        k = np.where((k < limit) & fits(k + 1), k + 1, k)
        k = np.where(fits(np.zeros_like(k)), k, -1)
        self._holds[key] = k
        return k


def _lower_bounds(forward: np.ndarray, backward: np.ndarray, transfers: np.ndarray | None,
                  most: int) -> np.ndarray:
    """Per structure (rows), a lower bound of its time for m = 1 .. `most` micro-batches
    (columns): stage s runs m forwards and m backwards, after the first micro-batch's
    forwards in front of it and before the last one's backwards there (`transfers`: delays
    between stages, None when transfers block and are in the stage times)."""
    m = np.arange(1, most + 1, dtype=float)[None, :]
    best = np.zeros((len(forward), most))
    ahead = np.zeros((len(forward), 1))
    for s in range(forward.shape[1]):
        if s > 0 and transfers is not None:
            ahead = ahead + 2 * transfers[:, s - 1:s]
        busy = (forward[:, s] + backward[:, s])[:, None]
        best = np.maximum(best, ahead + m * busy)
        ahead = ahead + busy
    return best


def _rate_per_gpu(x: _Structure) -> float:
    """Samples per GPU-second the structure can never exceed: its lower bounds grow by at
    least its slowest stage's forward and backward per micro-batch."""
    return x.micro_batch / (x.num_gpus * x.slowest_s)


class _Cancelled(Exception):
    pass


class _BranchAndBound:
    def __init__(self, scenario: Scenario, structures: list[_Structure], best_s: float,
                 deadline: float | None, progress: ExactProgress | None) -> None:
        self.scenario = scenario
        self.nodes = scenario.cluster.nodes
        self.batch = scenario.job.global_batch_size
        self.best_s = best_s
        self.best: Plan | None = None
        self.deadline = deadline
        self.progress = progress
        self.stopped = False
        self.visited = 0
        self.rings = _Rings(scenario)
        # Most promising first: by the most samples per GPU-second a structure can reach, an
        # upper bound that also caps every structure after it (used by `_least_time`).
        self.structures = sorted(structures, key=lambda x: -_rate_per_gpu(x))
        self.rates = [_rate_per_gpu(x) for x in self.structures]
        self.rate_array = np.array(self.rates)
        self.first_s = np.array([float(x.lower_s[0]) for x in self.structures])
        self.steady = np.array([x.micro_batch / x.slowest_s for x in self.structures])
        self.usage = np.array([x.usage for x in self.structures], dtype=int).reshape(
            len(self.structures), len(self.nodes))
        self._fitting: dict[tuple[int, ...], np.ndarray] = {}
        radix = np.cumprod([1] + [n.gpus + 1 for n in self.nodes])[:-1]
        self.usage_code = self.usage @ radix  # one integer per usage vector

    def run(self) -> Plan | None:
        free = tuple(n.gpus for n in self.nodes)
        try:
            self._seed(free)
            self._extend([], 0, free)
        except _Cancelled:
            self.stopped = True
        return self.best

    def _extend(self, chosen: list[_Structure], first: int, free: tuple[int, ...]) -> None:
        indices, rates = self._survivors(chosen, first, free)
        for index, rate in zip(indices.tolist(), rates.tolist(), strict=True):
            candidate = self.structures[index]
            self.visited += 1
            if self.visited % 2048 == 0:
                self._check_time(index, first)
            plan = [*chosen, candidate]
            if not self._passes(plan, 0.0, rate, quick=True):
                continue  # the best improved since the survivors were picked
            exact_sync = self.rings.sync_s(plan, len(plan), bound=False)
            if exact_sync >= self.best_s:
                continue  # every extension syncs at least as long
            if self._passes(plan, exact_sync, 0.0):
                self._judge(plan, exact_sync)
            if rate > 0:
                later = self.rings.sync_s(plan, len(plan) + 1, bound=True)
                if self._passes(plan, later, rate):
                    left = tuple(f - u for f, u in zip(free, candidate.usage, strict=True))
                    self._extend(plan, index, left)

    def _seed(self, free: tuple[int, ...]) -> None:
        """Replicas of one structure, as many as fit, for the most promising structures: a
        good bound early prunes most of the enumeration (data-parallel copies of one
        pipeline are what most optima are made of)."""
        for index, x in enumerate(self.structures[:SEEDS]):
            copies = min(f // u for f, u in zip(free, x.usage, strict=True) if u > 0)
            for count in {copies, max(1, copies // 2)}:
                plan = [x] * count
                if self._passes(plan, 0.0, 0.0):
                    sync_s = self.rings.sync_s(plan, count, bound=False)
                    if self._passes(plan, sync_s, 0.0):
                        self._judge(plan, sync_s)
            if index % 256 == 0:
                self._check_time(index, 1)

    def _survivors(self, chosen: Sequence[_Structure], first: int, free: tuple[int, ...]
                   ) -> tuple[np.ndarray, np.ndarray]:
        """The structures from `first` on that fit `free` and pass the cheap bound with no
        sync at all (all of them at once), with the most samples per second the pipelines
        still to come after each could add: the free GPUs left times the rate per GPU of
        the first structure from it on that fits them."""
        fitting = self._fits(free)
        indices = fitting[np.searchsorted(fitting, first):]
        rates = np.zeros(len(indices))
        codes = self.usage_code[indices]
        for code in np.unique(codes).tolist():
            same = np.flatnonzero(codes == code)
            shape = self.usage[indices[same[0]]]
            left = tuple(int(f - u) for f, u in zip(free, shape, strict=True))
            more = self._fits(left)
            after = np.searchsorted(more, indices[same])
            reach = after < len(more)
            rates[same[reach]] = sum(left) * self.rate_array[more[after[reach]]]
        floor = np.maximum(self.first_s[indices], max((float(x.lower_s[0]) for x in chosen),
                                                       default=0.0))
        steady = sum(x.micro_batch / x.slowest_s for x in chosen) + self.steady[indices] + rates
        keep = np.maximum(floor, self.batch / steady) < self.best_s
        return indices[keep], rates[keep]

    def _passes(self, plan: Sequence[_Structure], sync_s: float, rate: float, *,
                quick: bool = False) -> bool:
        """Whether plans made of `plan` and pipelines adding at most `rate` samples per
        second, syncing at least `sync_s`, could beat the best: a cheap bound (each chosen
        pipeline at its steady rate) first, then the tighter one."""
        floor = max(float(x.lower_s[0]) for x in plan)
        steady = sum(x.micro_batch / x.slowest_s for x in plan) + rate
        if sync_s + max(floor, self.batch / steady) >= self.best_s:
            return False
        return quick or sync_s + self._least_time(plan, rate) < self.best_s

    def _fits(self, free: tuple[int, ...]) -> np.ndarray:
        """Indices of the structures that fit in `free` GPUs per node, ascending."""
        if free not in self._fitting:
            self._fitting[free] = np.flatnonzero((self.usage <= np.array(free)).all(axis=1))
        return self._fitting[free]

    def _check_time(self, index: int, first: int) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise _Cancelled
        if self.progress is not None and first == 0:
            self.progress(index / max(1, len(self.structures)), "exact enumeration")

    def _least_time(self, plan: Sequence[_Structure], rate: float) -> float:
        """A lower bound of the pipeline time of any plan made of `plan` and more pipelines
        that together cover at most `rate` samples per second: the least time by which they
        could cover the batch, the chosen pipelines timed by their lower bounds (b samples
        more at each). The caller bounds `rate` by the free GPUs times the rate per GPU of
        the first structure that may still be added and fits them (structures come in
        falling rate per GPU)."""
        floor = max(float(x.lower_s[0]) for x in plan)
        times = np.concatenate([x.lower_s for x in plan])
        order = np.argsort(times, kind="stable")
        times = times[order]
        samples = np.cumsum(np.concatenate([np.full(len(x.lower_s), float(x.micro_batch))
                                            for x in plan])[order])
        # On [times[k], times[k + 1]) the cover is samples[k] + rate * T.
        ends = np.append(times[1:], np.inf)
        if rate > 0:
            needed = np.maximum(times, (self.batch - samples) / rate)
        else:
            needed = np.where(samples >= self.batch, times, np.inf)
        ok = needed < ends  # (every answer is at least `floor`, past the first end)
        return max(float(needed[ok].min()) if ok.any() else math.inf, floor)

    def _judge(self, plan: list[_Structure], sync_s: float) -> None:
        shares = _least_time_shares(plan, self.batch, self.scenario.job.schedule,
                                    self.scenario.job.blocking_transfers)
        if shares is None:
            return
        pipeline_s, micro_batches = shares
        if pipeline_s + sync_s >= self.best_s * (1 - 1e-12):
            return
        # The estimator has the last word (memory under ZeRO depends on the pipeline count).
        document = _plan_document(self.scenario, plan, micro_batches)
        judged = evaluate(self.scenario, document)
        if judged.valid and judged.iteration_s is not None and judged.iteration_s < self.best_s:
            self.best_s, self.best = judged.iteration_s, document


def _exact_time(x: _Structure, m: int, schedule: Schedule, blocking: bool) -> float:
    if m not in x.exact_s:
        forward, backward, transfers = x.times.tolist()
        x.exact_s[m] = simulate_pipeline(forward, backward, transfers[:-1], m, schedule,
                                         blocking_transfers=blocking)
    return x.exact_s[m]


def _least_time_shares(
    plan: Sequence[_Structure], batch: int, schedule: Schedule, blocking: bool
) -> tuple[float, list[int]] | None:
    """The least pipeline time over every batch share, and the shares."""
    times = sorted({_exact_time(x, m, schedule, blocking)
                    for x in plan for m in range(1, x.most_micro_batches + 1)})

    def shares_by(target: float) -> list[int] | None:
        most = [sum(1 for m in range(1, x.most_micro_batches + 1)
                    if _exact_time(x, m, schedule, blocking) <= target) for x in plan]
        return _shares_summing_to(batch, [x.micro_batch for x in plan], most)

    low, high = 0, len(times) - 1
    if not times or shares_by(times[-1]) is None:
        return None
    while low < high:
        middle = (low + high) // 2
        if shares_by(times[middle]) is not None:
            high = middle
        else:
            low = middle + 1
    found = shares_by(times[low])
    assert found is not None
    return times[low], found


def _shares_summing_to(batch: int, sizes: Sequence[int], most: Sequence[int]) -> list[int] | None:
    """Counts 1 <= m_p <= most_p with sum(sizes_p * m_p) == batch, if any (a bounded
    subset-sum over the batch)."""
    if any(m < 1 for m in most):
        return None
    reach = [np.zeros(batch + 1, dtype=bool)]
    reach[0][0] = True
    for b, top in zip(sizes, most, strict=True):
        here = np.zeros(batch + 1, dtype=bool)
        for m in range(1, top + 1):
            if b * m > batch:
                break
            here[b * m:] |= reach[-1][:batch + 1 - b * m]
        reach.append(here)
    if not reach[-1][batch]:
        return None
    counts = []
    left = batch
    for p in range(len(sizes) - 1, -1, -1):  # walk back through the table
        b = sizes[p]
        for m in range(1, most[p] + 1):
            if left - b * m >= 0 and reach[p][left - b * m]:
                counts.append(m)
                left -= b * m
                break
    return counts[::-1]


class _Rings:
    """Section 3's sync time of a multiset of structures, in the order given, and a lower
    bound of it over every plan that adds pipelines after them."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.nodes: list[Node] = list(scenario.cluster.nodes)
        self.params = [scenario.model.kinds[k].params for k in scenario.model.layers]
        self.grad_bytes = scenario.job.grad_bytes
        self.zoned = any(n.zone is not None for n in self.nodes)
        cluster = scenario.cluster
        links = [cluster.inter_node, *cluster.intra_node.values(), *cluster.inter_zone]
        self.fastest = max(x.bandwidth_gb_per_s for x in links) * 1e9
        self.quickest = min(x.latency_us for x in links) * 1e-6
        self._rings: dict[tuple[tuple[int, ...], tuple[int, ...], bool], tuple[float, float]] = {}

    def sync_s(self, plan: Sequence[_Structure], num_pipelines: int, *, bound: bool) -> float:
        n = num_pipelines
        if n <= 1:
            return 0.0
        used = tuple(map(sum, zip(*(x.usage for x in plan), strict=True)))
        per_byte = 2 * (n - 1) / n * self.grad_bytes
        per_step = 2 * (n - 1)
        # Per layer: parameters over the ring's bandwidth, and its latency, as prefix sums.
        # (This runs for every plan the branch and bound visits: loops kept flat.)
        weighted, steps = [0.0], [0.0]
        total_weighted = total_steps = 0.0
        ring_of = self._ring_of
        rings = zip(*(x.node_of_layer for x in plan), strict=True)
        for params, nodes in zip(self.params, rings, strict=True):
            bandwidth, latency = ring_of(nodes, used, bound)
            total_weighted += params / bandwidth
            total_steps += latency
            weighted.append(total_weighted)
            steps.append(total_steps)
        worst = 0.0
        for x in plan:
            for _, tp, start, end in x.stages:
                seconds = (per_byte * (weighted[end] - weighted[start]) / tp
                           + per_step * (steps[end] - steps[start]))
                if seconds > worst:
                    worst = seconds
        return worst

    def _ring_of(self, nodes: tuple[int, ...], used: tuple[int, ...], bound: bool
                 ) -> tuple[float, float]:
        key = (nodes, used, bound)
        found = self._rings.get(key)
        if found is None:
            share = [min(1.0, node.num_nics / u) if u else 1.0
                     for node, u in zip(self.nodes, used, strict=True)]
            if bound:
                found = self._bound(nodes, share)
            else:
                hops = [self._hop(a, b, share) for a, b in zip(nodes, nodes[1:] + nodes[:1],
                                                               strict=True)]
                found = (min(h[0] for h in hops), max(h[1] for h in hops))
            self._rings[key] = found
        return found

    def _hop(self, a: int, b: int, share: list[float]) -> tuple[float, float]:
        link = link_between(self.scenario, self.nodes[a], self.nodes[b])
        scale = 1.0 if a == b else min(share[a], share[b])
        return link.bandwidth_gb_per_s * 1e9 * scale, link.latency_us * 1e-6

    def _bound(self, ring: Sequence[int], share: list[float]) -> tuple[float, float]:
        """The most bandwidth and least latency any longer ring through these holders can
        have: a ring over two or more nodes has a hop between every node of it and another
        node, and more holders only share interfaces further."""
        if self.zoned:
            return self.fastest, self.quickest
        names = set(ring)
        inter = self.scenario.cluster.inter_node
        if len(names) >= 2:
            return (inter.bandwidth_gb_per_s * 1e9 * min(share[i] for i in names),
                    inter.latency_us * 1e-6)
        (only,) = names
        intra = self.scenario.cluster.intra_node[self.nodes[only].gpu_type]
        return (max(intra.bandwidth_gb_per_s, inter.bandwidth_gb_per_s * share[only]) * 1e9,
                min(intra.latency_us, inter.latency_us) * 1e-6)


def _plan_document(scenario: Scenario, plan: Sequence[_Structure], micro_batches: Sequence[int]) -> Plan:
    nodes = scenario.cluster.nodes
    next_free = [0] * len(nodes)
    pipelines = []
    for x, m in zip(plan, micro_batches, strict=True):
        stages = []
        for i, tp, start, end in x.stages:
            first = next_free[i]
            next_free[i] += tp
            stages.append(Stage(gpu_type=nodes[i].gpu_type, tp=tp,
                                gpus=[f"{nodes[i].name}:{g}" for g in range(first, first + tp)],
                                layers=(start, end)))
        pipelines.append(Pipeline(micro_batch_size=x.micro_batch, num_micro_batches=m, stages=stages))
    return Plan(schedule=scenario.job.schedule, pipelines=pipelines)
