"""The rank map of a plan: which process runs on which GPU, and the groups they form.

Ranks are numbered the way `torchrun` numbers them under static rendezvous:
nodes get `node_rank` in the order the plan first names them, each node's
processes get consecutive global ranks, and `local_rank` counts a node's
used GPUs in index order. Every launcher export and the reference launcher
derive their ranks from here, so a process can recompute its role from the
plan alone.

Groups:
- a TP group per stage, its ranks in the stage's GPU order (`tp_rank` is the
  position in `stage.gpus`);
- a link per pair of neighbouring stages: activations go from the first GPU
  of a stage to the first GPU of the next, gradients come back the same way,
  and the receiving stage broadcasts over its TP group (the cost model charges
  transfers on the link between first GPUs, section 3). A pipeline whose
  stages hold several chunks (interleaved-1f1b) also links its last stage back
  to its first: model chunk `j * S + S - 1` feeds chunk `(j + 1) * S` there;
- gradient-sync groups: consecutive layers held by the same set of stages (one
  per pipeline) share one entry. When every holder has the same TP degree, TP
  rank `t` of each holder all-reduces with TP rank `t` of the others
  (`"sharded"`); with mixed degrees shards do not line up, so every GPU of
  every holder joins one group that reduces full-size gradients
  (`"resharded"`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from planner.documents import LayerRange, Pipeline, Plan, Schedule
from planner.errors import InvalidPlan, Problem
from planner.schedules import chunk_layout_errors

__all__ = [
    "RANK_MAP_FORMAT",
    "RankInfo",
    "NodeRanks",
    "PipelineShare",
    "TpGroup",
    "StageLink",
    "StageRef",
    "SyncGroup",
    "RankMap",
    "build_rank_map",
    "rank_map",
]

RANK_MAP_FORMAT = "hetplan-rankmap/1"

SyncKind = Literal["sharded", "resharded"]


@dataclass(frozen=True, kw_only=True)
class RankInfo:
    rank: int
    gpu: str
    """The plan's name of the GPU, `node:index`."""
    node: str
    node_rank: int
    local_rank: int
    """Position of this GPU among the node's used GPUs in index order; with
    `CUDA_VISIBLE_DEVICES` set to the node's `device_indices`, `cuda:local_rank`."""
    device_index: int
    """The `index` of `node:index`: the physical device on the node."""
    pipeline: int
    stage: int
    tp_rank: int
    tp_size: int
    chunks: tuple[LayerRange, ...]
    """The stage's layer ranges: one, or under interleaved-1f1b chunk `j` of stage `s`,
    model chunk `j * S + s`, in chunk order."""
    recompute: bool = False
    """The stage keeps only each micro-batch's input and runs its forward again before the
    backward (full activation recomputation)."""

    @property
    def layers(self) -> LayerRange:
        """The stage's one layer range; `InvalidPlan` for a stage of several chunks, which
        code reading one range per stage must not guess at (read `chunks`)."""
        if len(self.chunks) == 1:
            return self.chunks[0]
        raise InvalidPlan([Problem(
            path=f"ranks[{self.rank}].chunks", value=[list(c) for c in self.chunks],
            message="this stage holds several layer chunks (interleaved-1f1b); read `chunks`, "
                    "not `layers`")])


@dataclass(frozen=True, kw_only=True)
class NodeRanks:
    name: str
    node_rank: int
    first_rank: int
    num_processes: int
    device_indices: tuple[int, ...]
    """Physical device indices in local-rank order."""


@dataclass(frozen=True, kw_only=True)
class PipelineShare:
    pipeline: int
    micro_batch_size: int
    num_micro_batches: int
    first_sample: int
    """Offset of this pipeline's samples in the global batch (pipelines take consecutive slices)."""
    num_samples: int
    batch_share: float
    """num_samples / global batch: the weight of this pipeline's gradient in the mean."""


@dataclass(frozen=True, kw_only=True)
class TpGroup:
    pipeline: int
    stage: int
    ranks: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class StageLink:
    pipeline: int
    from_stage: int
    to_stage: int
    src_rank: int
    """First GPU of `from_stage`: sends activations, receives gradients. Under
    interleaved-1f1b the last stage also links back to the first (`to_stage` 0)."""
    dst_rank: int
    """First GPU of `to_stage`: receives activations, sends gradients."""


@dataclass(frozen=True, kw_only=True)
class StageRef:
    pipeline: int
    stage: int
    tp_size: int


@dataclass(frozen=True, kw_only=True)
class SyncGroup:
    layers: tuple[int, int]
    holders: tuple[StageRef, ...]
    """One stage per pipeline, in pipeline order."""
    kind: SyncKind
    rank_groups: tuple[tuple[int, ...], ...]
    """Process groups to all-reduce over: one per TP rank (`sharded`), or one with every
    GPU of every holder (`resharded`)."""


@dataclass(frozen=True, kw_only=True)
class RankMap:
    world_size: int
    num_layers: int
    global_batch_size: int
    schedule: Schedule | None
    """The plan's schedule; None means the scenario job's (default 1f1b)."""
    nodes: tuple[NodeRanks, ...]
    ranks: tuple[RankInfo, ...]
    pipelines: tuple[PipelineShare, ...]
    tp_groups: tuple[TpGroup, ...]
    stage_links: tuple[StageLink, ...]
    sync_groups: tuple[SyncGroup, ...]

    def rank_of(self, gpu: str) -> int:
        for info in self.ranks:
            if info.gpu == gpu:
                return info.rank
        raise KeyError(f"GPU {gpu!r} is not in the plan")

    def stage_ranks(self, pipeline: int, stage: int) -> tuple[int, ...]:
        for group in self.tp_groups:
            if (group.pipeline, group.stage) == (pipeline, stage):
                return group.ranks
        raise KeyError(f"no stage {stage} in pipeline {pipeline}")


def _split_gpu(name: str) -> tuple[str, int]:
    node, _, index = name.rpartition(":")
    return node, int(index)


def _gpu_name_ok(name: str) -> bool:
    node, sep, index = name.rpartition(":")
    return bool(sep and node and index.isdigit())


def _check_structure(plan: Plan) -> int:
    """The model's layer count; `InvalidPlan` listing every reason the plan cannot be given
    ranks (a GPU named twice or badly, gaps in a pipeline's layers or chunks, tp not
    matching GPUs)."""
    problems: list[Problem] = []
    seen: set[str] = set()
    num_layers = max(end for stage in plan.pipelines[0].stages for _, end in stage.ranges)
    for p, pipeline in enumerate(plan.pipelines):
        problems += _layer_problems(p, pipeline, num_layers)
        for s, stage in enumerate(pipeline.stages):
            where = f"pipelines[{p}].stages[{s}]"
            if len(stage.gpus) != stage.tp:
                problems.append(Problem(
                    path=f"{where}.gpus", value=len(stage.gpus),
                    message=f"tp is {stage.tp}; list exactly tp GPUs"))
            for gpu in stage.gpus:
                if not _gpu_name_ok(gpu):
                    problems.append(Problem(path=f"{where}.gpus", value=gpu,
                                            message="name GPUs 'node:index', like 'a0:3'"))
                elif gpu in seen:
                    problems.append(Problem(path=f"{where}.gpus", value=gpu,
                                            message="GPU used twice; use each GPU once"))
                seen.add(gpu)
    if problems:
        raise InvalidPlan(problems)
    return num_layers


def _layer_problems(p: int, pipeline: Pipeline, num_layers: int) -> list[Problem]:
    """Stages (or, with chunks, model chunks) covering [0, num_layers) in order."""
    if any(stage.chunks is not None for stage in pipeline.stages):
        return [Problem(path=f"pipelines[{p}]", message=error)
                for error in chunk_layout_errors(f"pipelines[{p}]", pipeline, num_layers)]
    problems, start = [], 0
    for s, stage in enumerate(pipeline.stages):
        if stage.layers[0] != start or stage.layers[1] <= start:
            problems.append(Problem(
                path=f"pipelines[{p}].stages[{s}].layers", value=list(stage.layers),
                message=f"stages must cover the layers contiguously from {start}, none empty"))
        start = max(start, stage.layers[1])
    if start != num_layers:
        problems.append(Problem(
            path=f"pipelines[{p}]", value=[0, start],
            message=f"covers other layers than pipelines[0], [0, {num_layers}); every "
                    "pipeline must hold the whole model"))
    return problems


def _number_nodes(plan: Plan) -> tuple[tuple[NodeRanks, ...], dict[str, tuple[int, int, int]]]:
    """Nodes in order of first mention; per GPU (node_rank, local_rank, rank)."""
    devices: dict[str, list[int]] = {}
    for pipeline in plan.pipelines:
        for stage in pipeline.stages:
            for gpu in stage.gpus:
                node, index = _split_gpu(gpu)
                devices.setdefault(node, []).append(index)
    nodes, where, first_rank = [], {}, 0
    for node_rank, (name, indices) in enumerate(devices.items()):
        ordered = tuple(sorted(indices))
        nodes.append(NodeRanks(name=name, node_rank=node_rank, first_rank=first_rank,
                               num_processes=len(ordered), device_indices=ordered))
        for local_rank, index in enumerate(ordered):
            where[f"{name}:{index}"] = (node_rank, local_rank, first_rank + local_rank)
        first_rank += len(ordered)
    return tuple(nodes), where


def _sync_groups(plan: Plan, num_layers: int, ranks_of: dict[tuple[int, int], tuple[int, ...]]
                 ) -> tuple[SyncGroup, ...]:
    def holders_of(layer: int) -> tuple[StageRef, ...]:
        refs = []
        for p, pipeline in enumerate(plan.pipelines):
            for s, stage in enumerate(pipeline.stages):
                if any(start <= layer < end for start, end in stage.ranges):
                    refs.append(StageRef(pipeline=p, stage=s, tp_size=stage.tp))
        return tuple(refs)

    groups: list[SyncGroup] = []
    start = 0
    for layer in range(1, num_layers + 1):
        holders = holders_of(start)
        if layer < num_layers and holders_of(layer) == holders:
            continue
        tp_sizes = {h.tp_size for h in holders}
        members = [ranks_of[h.pipeline, h.stage] for h in holders]
        if len(tp_sizes) == 1:
            kind: SyncKind = "sharded"
            rank_groups = tuple(zip(*members, strict=True))
        else:
            kind = "resharded"
            rank_groups = (tuple(r for ranks in members for r in ranks),)
        groups.append(SyncGroup(layers=(start, layer), holders=holders, kind=kind,
                                rank_groups=rank_groups))
        start = layer
    return tuple(groups)


def build_rank_map(plan: Plan) -> RankMap:
    """Ranks and process groups of `plan`; `InvalidPlan` for a plan no launcher could run."""
    num_layers = _check_structure(plan)
    nodes, where = _number_nodes(plan)
    ranks: list[RankInfo] = []
    tp_groups: list[TpGroup] = []
    links: list[StageLink] = []
    shares: list[PipelineShare] = []
    ranks_of: dict[tuple[int, int], tuple[int, ...]] = {}
    global_batch = sum(p.micro_batch_size * p.num_micro_batches for p in plan.pipelines)
    first_sample = 0
    for p, pipeline in enumerate(plan.pipelines):
        samples = pipeline.micro_batch_size * pipeline.num_micro_batches
        shares.append(PipelineShare(
            pipeline=p, micro_batch_size=pipeline.micro_batch_size,
            num_micro_batches=pipeline.num_micro_batches, first_sample=first_sample,
            num_samples=samples, batch_share=samples / global_batch))
        first_sample += samples
        for s, stage in enumerate(pipeline.stages):
            stage_ranks = []
            for tp_rank, gpu in enumerate(stage.gpus):
                node_rank, local_rank, rank = where[gpu]
                stage_ranks.append(rank)
                ranks.append(RankInfo(
                    rank=rank, gpu=gpu, node=nodes[node_rank].name, node_rank=node_rank,
                    local_rank=local_rank, device_index=_split_gpu(gpu)[1], pipeline=p,
                    stage=s, tp_rank=tp_rank, tp_size=stage.tp, chunks=tuple(stage.ranges),
                    recompute=stage.recompute))
            ranks_of[p, s] = tuple(stage_ranks)
            tp_groups.append(TpGroup(pipeline=p, stage=s, ranks=tuple(stage_ranks)))
            if s > 0:
                links.append(StageLink(pipeline=p, from_stage=s - 1, to_stage=s,
                                       src_rank=ranks_of[p, s - 1][0], dst_rank=stage_ranks[0]))
        last = len(pipeline.stages) - 1
        if last > 0 and pipeline.stages[0].num_chunks > 1:
            links.append(StageLink(pipeline=p, from_stage=last, to_stage=0,
                                   src_rank=ranks_of[p, last][0], dst_rank=ranks_of[p, 0][0]))
    return RankMap(
        world_size=len(ranks), num_layers=num_layers, global_batch_size=global_batch,
        schedule=plan.schedule, nodes=nodes, ranks=tuple(sorted(ranks, key=lambda r: r.rank)),
        pipelines=tuple(shares), tp_groups=tuple(tp_groups), stage_links=tuple(links),
        sync_groups=_sync_groups(plan, num_layers, ranks_of))


def _rank_layers(info: RankInfo) -> dict[str, Any]:
    """As the plan writes a stage: `layers` for one range, else `chunks`; `recompute` only
    when true."""
    layers: dict[str, Any] = ({"layers": list(info.chunks[0])} if len(info.chunks) == 1
                              else {"chunks": [list(c) for c in info.chunks]})
    return layers | ({"recompute": True} if info.recompute else {})


def rank_map(plan: Plan) -> dict[str, Any]:
    """The rank map of `plan` as a JSON-ready dict (the CLI's and the API's answer)."""
    built = build_rank_map(plan)
    return {
        "format": RANK_MAP_FORMAT,
        "world_size": built.world_size,
        "num_layers": built.num_layers,
        "global_batch_size": built.global_batch_size,
        "schedule": None if built.schedule is None else built.schedule.value,
        "nodes": [
            {"name": n.name, "node_rank": n.node_rank, "first_rank": n.first_rank,
             "num_processes": n.num_processes, "device_indices": list(n.device_indices)}
            for n in built.nodes
        ],
        "ranks": [
            {"rank": r.rank, "gpu": r.gpu, "node": r.node, "node_rank": r.node_rank,
             "local_rank": r.local_rank, "device_index": r.device_index,
             "pipeline": r.pipeline, "stage": r.stage, "tp_rank": r.tp_rank,
             "tp_size": r.tp_size, **_rank_layers(r)}
            for r in built.ranks
        ],
        "pipelines": [
            {"pipeline": s.pipeline, "micro_batch_size": s.micro_batch_size,
             "num_micro_batches": s.num_micro_batches, "first_sample": s.first_sample,
             "num_samples": s.num_samples, "batch_share": s.batch_share}
            for s in built.pipelines
        ],
        "tp_groups": [
            {"pipeline": g.pipeline, "stage": g.stage, "ranks": list(g.ranks)}
            for g in built.tp_groups
        ],
        "stage_links": [
            {"pipeline": k.pipeline, "from_stage": k.from_stage, "to_stage": k.to_stage,
             "src_rank": k.src_rank, "dst_rank": k.dst_rank}
            for k in built.stage_links
        ],
        "sync_groups": [
            {"layers": list(g.layers), "kind": g.kind,
             "holders": [{"pipeline": h.pipeline, "stage": h.stage, "tp_size": h.tp_size}
                         for h in g.holders],
             "rank_groups": [list(ranks) for ranks in g.rank_groups]}
            for g in built.sync_groups
        ],
    }
