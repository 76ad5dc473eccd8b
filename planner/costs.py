"""Cost terms of docs/formats.md: links, transfers, stage compute, memory, sync.

Pure functions over a `Scenario`; times in seconds, sizes in bytes unless a
name says otherwise. `ProfileIndex` answers profile lookups in O(1).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from planner.documents import LayerRange, Link, Node, ProfileRow, Scenario, Schedule

__all__ = [
    "GIB",
    "ProfilePoint",
    "ProfileIndex",
    "NodeIndex",
    "per_scenario",
    "node_index",
    "profile_index",
    "RangeIndex",
    "RangeSums",
    "range_index",
    "link_between",
    "zone_link",
    "transfer_s",
    "in_flight",
    "StateBytes",
    "state_bytes_per_param",
    "ring_hop",
]

GIB = float(2**30)

ProfilePoint = tuple[str, str, int, int]
"""(gpu_type, kind, micro_batch, tp)"""


class ProfileIndex:
    """Profile rows keyed by their point."""

    def __init__(self, rows: Iterable[ProfileRow]) -> None:
        self._rows: dict[ProfilePoint, ProfileRow] = {
            (r.gpu_type, r.kind, r.micro_batch, r.tp): r for r in rows
        }

    def get(self, gpu_type: str, kind: str, micro_batch: int, tp: int) -> ProfileRow | None:
        return self._rows.get((gpu_type, kind, micro_batch, tp))

    def points(self) -> Iterable[ProfilePoint]:
        return self._rows.keys()

    def complete_points(self, gpu_type: str, kinds: set[str]) -> list[tuple[int, int]]:
        """(micro_batch, tp) pairs of `gpu_type` that have a row for every one of `kinds`."""
        seen: dict[tuple[int, int], set[str]] = {}
        for t, kind, b, tp in self._rows:
            if t == gpu_type:
                seen.setdefault((b, tp), set()).add(kind)
        return sorted(point for point, have in seen.items() if kinds <= have)


class NodeIndex:
    """Nodes by name, and the parsing of `node:index` GPU names."""

    def __init__(self, scenario: Scenario) -> None:
        self.by_name: dict[str, Node] = {n.name: n for n in scenario.cluster.nodes}
        self._located: dict[str, tuple[Node, int]] = {}

    def locate(self, gpu: str) -> tuple[Node, int] | None:
        """The node and local index of a GPU name, or None if it names no GPU."""
        known = self._located.get(gpu)
        if known is not None:
            return known
        name, sep, index = gpu.rpartition(":")
        node = self.by_name.get(name)
        if not sep or node is None or not index.isdigit() or int(index) >= node.gpus:
            return None
        # Only GPUs of the cluster are kept: a plan naming others cannot grow the index.
        found = self._located[gpu] = (node, int(index))
        return found


T = TypeVar("T")


def per_scenario(build: Callable[[Scenario], T]) -> Callable[[Scenario], T]:
    """`build`, computed once per scenario document. Scenarios are frozen, and the search
    judges thousands of plans against one: what each judgement derives from the scenario
    alone is kept while the scenario lives."""
    known: dict[int, tuple[weakref.ref[Scenario], T]] = {}

    @functools.wraps(build)
    def cached(scenario: Scenario) -> T:
        key = id(scenario)
        found = known.get(key)
        if found is not None and found[0]() is scenario:
            return found[1]
        value = build(scenario)
        known[key] = (weakref.ref(scenario, lambda _: known.pop(key, None)), value)
        return value

    return cached


@per_scenario
def node_index(scenario: Scenario) -> NodeIndex:
    """The scenario's `NodeIndex`, built once."""
    return NodeIndex(scenario)


@per_scenario
def profile_index(scenario: Scenario) -> ProfileIndex:
    """The scenario's `ProfileIndex`, built once."""
    return ProfileIndex(scenario.profiles)


RangeSums = tuple[float, float, float, float, bool]
"""(forward ms, backward ms, activation bytes, parameters) of a layer range over the profile
rows the scenario has, and whether it has every one."""


class RangeIndex:
    """Sums over layer ranges at one (GPU type, tp, micro-batch), each computed once:
    replicas, and the plans one search judges, repeat their ranges."""

    def __init__(self, scenario: Scenario) -> None:
        self._scenario = scenario
        self._profiles = profile_index(scenario)
        self._sums: dict[tuple[str, int, int, int, int], RangeSums] = {}

    def sums(self, gpu_type: str, tp: int, b: int, start: int, end: int) -> RangeSums:
        key = (gpu_type, tp, b, start, end)
        found = self._sums.get(key)
        if found is None:
            model = self._scenario.model
            kinds = model.layers[start:end]
            rows = [self._profiles.get(gpu_type, kind, b, tp) for kind in kinds]
            found = self._sums[key] = (sum(r.forward_ms for r in rows if r is not None),
                                       sum(r.backward_ms for r in rows if r is not None),
                                       sum(r.activation_bytes for r in rows if r is not None),
                                       sum(model.kinds[k].params for k in kinds),
                                       all(r is not None for r in rows))
        return found


@per_scenario
def range_index(scenario: Scenario) -> RangeIndex:
    """The scenario's `RangeIndex`, filled as ranges are asked for."""
    return RangeIndex(scenario)


def link_between(scenario: Scenario, a: Node, b: Node) -> Link:
    """The link that joins a GPU on node `a` to one on node `b` (section 1)."""
    cluster = scenario.cluster
    if a.name == b.name:
        return cluster.intra_node[a.gpu_type]
    return zone_link(scenario, a.zone, b.zone)


def zone_link(scenario: Scenario, a: str | None, b: str | None) -> Link:
    """The link between two different nodes in zones `a` and `b` (None: any zone)."""
    cluster = scenario.cluster
    if a is None or b is None or a == b:
        return cluster.inter_node
    for link in cluster.inter_zone:
        if set(link.zones) == {a, b}:
            return link
    return cluster.inter_node


def transfer_s(link: Link, num_bytes: float, bandwidth_scale: float = 1.0) -> float:
    """latency + bytes / bandwidth, in seconds."""
    return link.latency_us * 1e-6 + num_bytes / (link.bandwidth_gb_per_s * 1e9 * bandwidth_scale)


def chunk_transfers_s(scenario: Scenario, first_nodes: Sequence[Node],
                      ranges: Sequence[LayerRange], micro_batch: int) -> list[float]:
    """Seconds from each model chunk to the next (section 6): chunk c hands its output to
    chunk c + 1 on stage (c + 1) mod S, between the stages' first GPUs' nodes; one stage
    sends nothing."""
    model, num_stages = scenario.model, len(first_nodes)
    return [
        0.0 if num_stages == 1 else
        transfer_s(link_between(scenario, first_nodes[c % num_stages],
                                first_nodes[(c + 1) % num_stages]),
                   model.kinds[model.layers[end - 1]].output_bytes_per_sample * micro_batch)
        for c, (_, end) in enumerate(ranges[:-1])
    ]


def in_flight(stage: int, num_stages: int, num_micro_batches: int, schedule: Schedule) -> int:
    """Micro-batches whose activations a stage keeps at once (section 4)."""
    if schedule is Schedule.GPIPE:
        return num_micro_batches
    return min(num_stages - stage, num_micro_batches)


@dataclass(frozen=True, kw_only=True)
class StateBytes:
    """Bytes per parameter held for weights, gradients and optimizer state."""

    param: float
    grad: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.param + self.grad + self.optimizer


def state_bytes_per_param(scenario: Scenario, num_pipelines: int) -> StateBytes:
    """Section 4's per-parameter state with ZeRO sharding over `num_pipelines`."""
    job = scenario.job
    optimizer = job.optimizer_bytes / num_pipelines if job.zero_stage >= 1 else job.optimizer_bytes
    grad = job.grad_bytes / num_pipelines if job.zero_stage == 2 else job.grad_bytes
    return StateBytes(param=job.param_bytes, grad=grad, optimizer=optimizer)


def ring_hop(
    scenario: Scenario, a: Node, b: Node, nic_share: dict[str, float]
) -> tuple[float, float]:
    """(bandwidth in bytes/s, latency in s) of one sync-ring hop between two holders.

    Hops between nodes share the nodes' interfaces: all GPUs sync at once.
    """
    link = link_between(scenario, a, b)
    scale = 1.0 if a.name == b.name else min(nic_share[a.name], nic_share[b.name])
    return link.bandwidth_gb_per_s * 1e9 * scale, link.latency_us * 1e-6


def ring_cost(hops: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Smallest bandwidth and largest latency of a ring's hops."""
    return min(h[0] for h in hops), max(h[1] for h in hops)
