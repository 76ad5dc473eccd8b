"""One process of a launched plan: build this stage's layers, run the schedule, sync, step.

Every process runs `run_worker(ctx, plan_document, config)` with the same
arguments; the rank map tells each which GPU of the plan it plays. Per step:

1. Every pipeline takes its consecutive slice of the global batch (the rank
   map's `first_sample`), cut into its micro-batches.
2. Each stage runs its forwards and backwards in the plan's order (1F1B or
   GPipe, `planner.simulate.stage_order`, the same order the estimator
   simulates). Activations go from the first GPU of a stage to the first GPU
   of the next and gradients come back the same way, by point-to-point
   messages; a TP stage's first GPU broadcasts what it receives over its TP
   group.
3. Each micro-batch's loss is scaled by `micro_batch_size / global_batch`
   before its backward, so the gradients summed over every micro-batch of
   every pipeline are the gradient of the mean loss over the global batch.
4. Gradients are summed layer group by layer group over the rank map's sync
   groups: directly on shards when all holders share a TP degree, through
   full-size buffers when they do not.
5. The optimizer steps on this rank's parameters only.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn

from launcher.data import global_batch
from launcher.optim import Adam, Sgd
from planner.documents import Schedule, parse_plan
from planner.export.ranks import RankInfo, RankMap, SyncGroup, build_rank_map
from planner.simulate import FORWARD, stage_order
from profiles.distributed import DistContext, report_progress
from profiles.torch_layers import ModelSpec, build_layer, get_preset, layer_kinds, shard_tensor

__all__ = ["TrainConfig", "WorkerResult", "run_worker", "resolve_schedule"]

HEAD = "head"


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    model: str = "tiny-gpt"
    """A preset of `profiles.models.PRESETS`."""
    steps: int = 1
    seed: int = 0
    """Seeds both the weights (per layer) and the data (per step)."""
    optimizer: Literal["sgd", "adam"] = "sgd"
    lr: float = 0.1
    schedule: Schedule | None = None
    """Overrides the plan's schedule; None: the plan's, else 1f1b (the job default)."""
    return_weights: bool = False
    """Send this rank's parameters back after the last step (for equivalence checks)."""
    cpu_threads: int | None = None
    """Intra-op threads per process; None keeps the spawner's choice (the cores split
    evenly). Match the profile's setting when comparing with estimates."""


@dataclass(kw_only=True)
class WorkerResult:
    rank: int
    pipeline: int
    stage: int
    tp_rank: int
    losses: list[float] = field(default_factory=list)
    """Mean loss over the global batch, per step (the same on every rank)."""
    step_s: list[float] = field(default_factory=list)
    """Slowest rank's wall time of each step."""
    weights: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    """Layer index -> parameter name -> this rank's tensor (only with return_weights)."""


def resolve_schedule(plan_schedule: Schedule | None, override: Schedule | None) -> Schedule:
    return override or plan_schedule or Schedule.ONE_F_ONE_B


class _Groups:
    """Process groups by member ranks. `new_group` must be called by every rank in the same
    order, members or not, so all are created up front from the rank map."""

    def __init__(self, ranks: RankMap) -> None:
        self._groups: dict[tuple[int, ...], Any] = {}
        wanted = [g.ranks for g in ranks.tp_groups]
        wanted += [members for g in ranks.sync_groups for members in g.rank_groups]
        for members in wanted:
            key = tuple(sorted(members))
            if len(key) > 1 and key not in self._groups:
                self._groups[key] = dist.new_group(list(key))

    def get(self, members: tuple[int, ...]) -> Any:
        return self._groups.get(tuple(sorted(members)))


@dataclass(kw_only=True)
class _Stage:
    """This rank's share of one stage: its layers, neighbours and TP group."""

    me: RankInfo
    spec: ModelSpec
    kinds: list[str]
    layers: dict[int, nn.Module]
    stage_ranks: tuple[int, ...]
    tp_group: Any
    prev_rank: int | None
    """First GPU of the previous stage (None on the first stage)."""
    next_rank: int | None

    @property
    def leader(self) -> bool:
        """The stage's first GPU, the one that talks to the neighbouring stages."""
        return self.me.tp_rank == 0

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        for index, layer in self.layers.items():
            x = layer(x, labels) if self.kinds[index] == HEAD else layer(x)
        return x

    def share(self, tensor: torch.Tensor) -> None:
        """Broadcast the leader's tensor to the whole TP group, in place."""
        if self.me.tp_size > 1:
            dist.broadcast(tensor, src=self.stage_ranks[0], group=self.tp_group)


def _build_stage(ranks: RankMap, rank: int, spec: ModelSpec, seed: int, groups: _Groups) -> _Stage:
    me = ranks.ranks[rank]
    kinds = layer_kinds(spec)
    if ranks.num_layers != len(kinds):
        raise ValueError(f"the plan has {ranks.num_layers} layers but {spec.name} has "
                         f"{len(kinds)} ({kinds}); plan for this model's layers")
    stage_ranks = ranks.stage_ranks(me.pipeline, me.stage)
    tp_group = groups.get(stage_ranks)
    layers = {
        index: build_layer(spec, kinds[index], layer_index=index, seed=seed, tp_rank=me.tp_rank,
                           tp_size=me.tp_size, tp_group=tp_group)
        for index in range(*me.layers)
    }
    num_stages = sum(1 for g in ranks.tp_groups if g.pipeline == me.pipeline)
    prev_rank = ranks.stage_ranks(me.pipeline, me.stage - 1)[0] if me.stage > 0 else None
    next_rank = (ranks.stage_ranks(me.pipeline, me.stage + 1)[0]
                 if me.stage + 1 < num_stages else None)
    return _Stage(me=me, spec=spec, kinds=kinds, layers=layers, stage_ranks=stage_ranks,
                  tp_group=tp_group, prev_rank=prev_rank, next_rank=next_rank)


def _run_schedule(stage: _Stage, ranks: RankMap, schedule: Schedule, tokens: torch.Tensor,
                  labels: torch.Tensor) -> float:
    """Forwards and backwards of every micro-batch in schedule order; returns the summed,
    batch-weighted loss of this stage's micro-batches (0 unless it holds the head)."""
    share = ranks.pipelines[stage.me.pipeline]
    b, m = share.micro_batch_size, share.num_micro_batches
    num_stages = sum(1 for g in ranks.tp_groups if g.pipeline == stage.me.pipeline)
    weight = b / ranks.global_batch_size
    hidden_shape = (b, stage.spec.seq_len, stage.spec.hidden)
    inputs: dict[int, torch.Tensor] = {}
    outputs: dict[int, torch.Tensor] = {}
    sends: list[Any] = []
    weighted_loss = 0.0
    for direction, i in stage_order(stage.me.stage, num_stages, m, schedule):
        rows = slice(share.first_sample + i * b, share.first_sample + (i + 1) * b)
        if direction == FORWARD:
            if stage.prev_rank is None:
                x = tokens[rows]
            else:
                x = torch.empty(hidden_shape)
                if stage.leader:
                    dist.recv(x, src=stage.prev_rank, tag=i)
                stage.share(x)
                x.requires_grad_(True)
            inputs[i] = x
            out = stage.forward(x, labels[rows])
            if stage.next_rank is None:
                weighted_loss += weight * out.item()
                out = out * weight  # backward of the scaled loss: see the module docstring
            elif stage.leader:
                # isend: a blocking send could wait on a neighbour that is itself sending.
                sends.append(dist.isend(out.detach().contiguous(), dst=stage.next_rank, tag=i))
            outputs[i] = out
        else:
            out = outputs.pop(i)
            if stage.next_rank is None:
                out.backward()
            else:
                grad = torch.empty(hidden_shape)
                if stage.leader:
                    dist.recv(grad, src=stage.next_rank, tag=i)
                stage.share(grad)
                out.backward(grad)
            x = inputs.pop(i)
            if stage.prev_rank is not None and stage.leader:
                assert x.grad is not None
                sends.append(dist.isend(x.grad.contiguous(), dst=stage.prev_rank, tag=i))
    for work in sends:
        work.wait()
    return weighted_loss


@dataclass(frozen=True, kw_only=True)
class _Placement:
    """Where a sharded parameter's local elements sit in the full (TP=1) tensor."""

    positions: torch.Tensor
    """Flat indices into the full tensor, in the shard's flat order."""
    full_numel: int


# Per (layer index, parameter name): its placement, or None for a replicated parameter.
Placements = dict[tuple[int, str], _Placement | None]


def _sync_gradients(stage: _Stage, ranks: RankMap, groups: _Groups,
                    full_index: Placements) -> None:
    """Sum each layer group's gradients over the stages that hold it, one per pipeline."""
    for sync in ranks.sync_groups:
        for members in sync.rank_groups:
            if stage.me.rank in members and len(members) > 1:
                _reduce_group(stage, sync, groups.get(members), full_index)


def _local_params(stage: _Stage, sync: SyncGroup) -> list[tuple[int, str, nn.Parameter]]:
    return [(index, name, param) for index in range(*sync.layers)
            for name, param in stage.layers[index].named_parameters()]


def _reduce_group(stage: _Stage, sync: SyncGroup, group: Any, full_index: Placements) -> None:
    params = _local_params(stage, sync)
    grads = [_grad(param) for _, _, param in params]
    if sync.kind == "sharded":
        flat = torch.cat([g.flatten() for g in grads])
        dist.all_reduce(flat, group=group)
    else:
        # Mixed TP degrees: reduce full-size tensors. A shard lands at its place in the full
        # tensor; a replicated parameter's gradient, the same on all tp ranks, counts 1/tp.
        parts = []
        for (index, name, _), grad in zip(params, grads, strict=True):
            place = full_index[index, name]
            if place is None:
                parts.append(grad.flatten() / stage.me.tp_size)
            else:
                full = torch.zeros(place.full_numel)
                full[place.positions] = grad.flatten()
                parts.append(full)
        flat = torch.cat(parts)
        dist.all_reduce(flat, group=group)
        pieces = []
        for part, (index, name, _) in zip(flat.split([p.numel() for p in parts]), params,
                                               strict=True):
            place = full_index[index, name]
            pieces.append(part if place is None else part[place.positions])
        flat = torch.cat(pieces)
    for grad, piece in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
        grad.copy_(piece.view_as(grad))


def _grad(param: nn.Parameter) -> torch.Tensor:
    if param.grad is None:
        param.grad = torch.zeros_like(param)
    return param.grad


def _full_placement(stage: _Stage, ranks: RankMap) -> Placements:
    """For each parameter of a layer in a mixed-TP sync group: the flat positions of this
    rank's shard in the full tensor, or None when the parameter is replicated."""
    placement: Placements = {}
    mixed = [g for g in ranks.sync_groups if g.kind == "resharded"
             and any(stage.me.rank in members for members in g.rank_groups)]
    for sync in mixed:
        for index in range(*sync.layers):
            # Shapes only; a TP=1 build of one layer of a small model is cheap.
            full = build_layer(stage.spec, stage.kinds[index], layer_index=index)
            for name, param in full.named_parameters():
                positions = torch.arange(param.numel()).view(param.shape)
                shard = shard_tensor(name, positions, tp_rank=stage.me.tp_rank,
                                     tp_size=stage.me.tp_size)
                replicated = shard.shape == param.shape
                placement[index, name] = None if replicated else _Placement(
                    positions=shard.flatten(), full_numel=param.numel())
    return placement


def _optimizer(stage: _Stage, config: TrainConfig) -> Sgd | Adam:
    params = [p for layer in stage.layers.values() for p in layer.parameters()]
    if config.optimizer == "adam":
        return Adam(params, lr=config.lr)
    return Sgd(params, lr=config.lr)


def run_worker(ctx: DistContext, plan_document: dict[str, Any], config: TrainConfig
               ) -> WorkerResult:
    """Train `config.steps` steps of the plan as rank `ctx.rank`; the same call on every rank."""
    torch.manual_seed(config.seed)  # nothing should draw from it; fixes it if something does
    if config.cpu_threads is not None:
        torch.set_num_threads(config.cpu_threads)
    ranks = build_rank_map(parse_plan(plan_document))
    if ctx.world_size != ranks.world_size:
        raise ValueError(f"the plan has {ranks.world_size} GPUs but {ctx.world_size} processes "
                         "were started; start one process per GPU of the plan")
    schedule = resolve_schedule(ranks.schedule, config.schedule)
    spec = get_preset(config.model)
    groups = _Groups(ranks)
    stage = _build_stage(ranks, ctx.rank, spec, config.seed, groups)
    full_index = _full_placement(stage, ranks)
    optimizer = _optimizer(stage, config)
    result = WorkerResult(rank=ctx.rank, pipeline=stage.me.pipeline, stage=stage.me.stage,
                          tp_rank=stage.me.tp_rank)
    for step in range(config.steps):
        tokens, labels = global_batch(spec, ranks.global_batch_size, seed=config.seed, step=step)
        dist.barrier()
        started = time.perf_counter()
        for layer in stage.layers.values():
            layer.zero_grad(set_to_none=False)
        weighted_loss = _run_schedule(stage, ranks, schedule, tokens, labels)
        _sync_gradients(stage, ranks, groups, full_index)
        optimizer.step()
        elapsed = torch.tensor([time.perf_counter() - started])
        # Only the first GPU of a last stage reports its loss, so each micro-batch counts once.
        counted = weighted_loss if stage.next_rank is None and stage.leader else 0.0
        loss = torch.tensor([counted])
        dist.all_reduce(loss)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        result.losses.append(float(loss))
        result.step_s.append(float(elapsed))
        report_progress(ctx, json.dumps({"step": step, "loss": float(loss),
                                         "step_s": float(elapsed)}))
    if config.return_weights:
        result.weights = {
            index: {name: p.detach().clone() for name, p in layer.named_parameters()}
            for index, layer in stage.layers.items()
        }
    return result
