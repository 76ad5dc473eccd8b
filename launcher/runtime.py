"""One process of a launched plan: build this stage's layers, run the schedule, sync, step.

Every process runs `run_worker(ctx, plan_document, config)` with the same
arguments; the rank map tells each which GPU of the plan it plays. Per step:

1. Every pipeline takes its consecutive slice of the global batch (the rank
   map's `first_sample`), cut into its micro-batches.
2. Each stage runs its forwards and backwards in the plan's order (1F1B,
   GPipe, interleaved 1F1B or local; `launcher.stage`, with the operation
   order the estimator simulates). Activations and gradients move by
   point-to-point messages between the first GPUs of stages; a TP stage's
   first GPU broadcasts what it receives over its TP group.
3. Each micro-batch's loss is scaled by `micro_batch_size / global_batch`
   before its backward, so the gradients summed over every micro-batch of
   every pipeline are the gradient of the mean loss over the global batch
   (under `local`, of each block's mean local loss).
4. Gradients are summed layer group by layer group over the sync groups
   (`launcher.layout`): directly on shards when all holders share a TP degree,
   through full-size buffers when they do not. Under `local` a block's head
   joins its block's group.
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
from launcher.layout import launch_problems, launch_rank_map
from launcher.optim import Adam, Sgd
from launcher.stage import StageRole, build_stage, run_schedule
from planner.documents import Plan, Schedule, parse_plan
from planner.export.ranks import RankMap, SyncGroup
from profiles.distributed import DistContext, report_progress
from profiles.torch_layers import build_layer, get_preset, layer_kinds, shard_tensor

__all__ = ["TrainConfig", "WorkerResult", "run_worker", "resolve_schedule", "check_plan"]


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
    """Mean loss of the model's head over the global batch, per step (the same on every
    rank)."""
    local_losses: list[list[float]] = field(default_factory=list)
    """Under `local`, per step: the mean local-head loss over the global batch of every block
    but the last, in block order (the same on every rank); empty lists otherwise."""
    step_s: list[float] = field(default_factory=list)
    """Slowest rank's wall time of each step."""
    weights: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    """Layer index -> parameter name -> this rank's tensor (only with return_weights)."""
    operations: list[tuple[int, int, int]] = field(default_factory=list)
    """(model chunk, direction 0 forward / 1 backward, micro-batch) in the order this rank ran
    them in its last step."""
    local_head: dict[str, torch.Tensor] = field(default_factory=dict)
    """Parameter name -> tensor of this stage's local head (under `local`, with
    return_weights; a local head is replicated over TP, so whole)."""


def resolve_schedule(plan_schedule: Schedule | None, override: Schedule | None) -> Schedule:
    return override or plan_schedule or Schedule.ONE_F_ONE_B


def check_plan(plan: Plan, config: TrainConfig) -> RankMap:
    """The plan's rank map, or a `ValueError` saying what to change when the workers could not
    run it: another number of layers than the model, or a layout its schedule cannot run."""
    spec = get_preset(config.model)
    kinds = layer_kinds(spec)
    num_layers = max(end for stage in plan.pipelines[0].stages for _, end in stage.ranges)
    if num_layers != len(kinds):
        raise ValueError(f"the plan splits {num_layers} layers but model {spec.name} has "
                         f"{len(kinds)} (embedding, {spec.num_blocks} blocks, head); choose "
                         "the model the plan was made for with --model, or plan for this one")
    problems = launch_problems(plan, resolve_schedule(plan.schedule, config.schedule), len(kinds))
    if problems:
        raise ValueError("the launcher cannot run this plan:\n  - " + "\n  - ".join(problems))
    return launch_rank_map(plan)


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


@dataclass(frozen=True, kw_only=True)
class _Placement:
    """Where a sharded parameter's local elements sit in the full (TP=1) tensor."""

    positions: torch.Tensor
    """Flat indices into the full tensor, in the shard's flat order."""
    full_numel: int


# Per (layer index, parameter name): its placement, or None for a replicated parameter.
Placements = dict[tuple[int, str], _Placement | None]


def _sync_gradients(stage: StageRole, ranks: RankMap, groups: _Groups,
                    full_index: Placements) -> None:
    """Sum each layer group's gradients over the stages that hold it, one per pipeline."""
    for sync in ranks.sync_groups:
        for members in sync.rank_groups:
            if stage.me.rank in members and len(members) > 1:
                _reduce_group(stage, sync, groups.get(members), full_index)


def _sync_params(stage: StageRole, sync: SyncGroup, full_index: Placements
                 ) -> list[tuple[nn.Parameter, _Placement | None]]:
    """This rank's parameters in `sync` with their placements; a local head joins the group
    that ends with its block (replicated under TP, so no placement)."""
    params = [(param, full_index.get((index, name))) for index in range(*sync.layers)
              for name, param in stage.layers[index].named_parameters()]
    if stage.local_head is not None and sync.layers[1] - 1 == stage.last_layer:
        params += [(param, None) for param in stage.local_head.parameters()]
    return params


def _reduce_group(stage: StageRole, sync: SyncGroup, group: Any, full_index: Placements) -> None:
    params = _sync_params(stage, sync, full_index)
    grads = [_grad(param) for param, _ in params]
    if sync.kind == "sharded":
        flat = torch.cat([g.flatten() for g in grads])
        dist.all_reduce(flat, group=group)
    else:
        # Mixed TP degrees: reduce full-size tensors. A shard lands at its place in the full
        # tensor; a replicated parameter's gradient, the same on all tp ranks, counts 1/tp.
        parts = []
        for (_, place), grad in zip(params, grads, strict=True):
            if place is None:
                parts.append(grad.flatten() / stage.me.tp_size)
            else:
                full = torch.zeros(place.full_numel)
                full[place.positions] = grad.flatten()
                parts.append(full)
        flat = torch.cat(parts)
        dist.all_reduce(flat, group=group)
        pieces = [part if place is None else part[place.positions]
                  for part, (_, place) in zip(flat.split([p.numel() for p in parts]), params,
                                              strict=True)]
        flat = torch.cat(pieces)
    for grad, piece in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
        grad.copy_(piece.view_as(grad))


def _grad(param: nn.Parameter) -> torch.Tensor:
    if param.grad is None:
        param.grad = torch.zeros_like(param)
    return param.grad


def _full_placement(stage: StageRole, ranks: RankMap) -> Placements:
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


def _modules(stage: StageRole) -> list[nn.Module]:
    return [*stage.layers.values(), *([] if stage.local_head is None else [stage.local_head])]


def _optimizer(stage: StageRole, config: TrainConfig) -> Sgd | Adam:
    params = [p for module in _modules(stage) for p in module.parameters()]
    if config.optimizer == "adam":
        return Adam(params, lr=config.lr)
    return Sgd(params, lr=config.lr)


def run_worker(ctx: DistContext, plan_document: dict[str, Any], config: TrainConfig
               ) -> WorkerResult:
    """Train `config.steps` steps of the plan as rank `ctx.rank`; the same call on every rank."""
    torch.manual_seed(config.seed)  # nothing should draw from it; fixes it if something does
    if config.cpu_threads is not None:
        torch.set_num_threads(config.cpu_threads)
    plan = parse_plan(plan_document)
    ranks = check_plan(plan, config)
    if ctx.world_size != ranks.world_size:
        raise ValueError(f"the plan has {ranks.world_size} GPUs but {ctx.world_size} processes "
                         "were started; start one process per GPU of the plan")
    schedule = resolve_schedule(plan.schedule, config.schedule)
    spec = get_preset(config.model)
    groups = _Groups(ranks)
    me = ranks.ranks[ctx.rank]
    stage = build_stage(plan, ranks, ctx.rank, spec, seed=config.seed, schedule=schedule,
                        tp_group=groups.get(ranks.stage_ranks(me.pipeline, me.stage)))
    full_index = _full_placement(stage, ranks)
    optimizer = _optimizer(stage, config)
    result = WorkerResult(rank=ctx.rank, pipeline=me.pipeline, stage=me.stage, tp_rank=me.tp_rank)
    num_blocks = len(plan.pipelines[0].stages) if schedule is Schedule.LOCAL else 1
    for step in range(config.steps):
        tokens, labels = global_batch(spec, ranks.global_batch_size, seed=config.seed, step=step)
        dist.barrier()
        started = time.perf_counter()
        for module in _modules(stage):
            module.zero_grad(set_to_none=False)
        record = run_schedule(stage, ranks.pipelines[me.pipeline], schedule, tokens, labels,
                              ranks.global_batch_size)
        _sync_gradients(stage, ranks, groups, full_index)
        optimizer.step()
        elapsed = torch.tensor([time.perf_counter() - started])
        # One number per block: the model's loss last, each local head's before it. Only first
        # GPUs report, so each micro-batch counts once.
        reported = torch.zeros(num_blocks)
        if stage.leader:
            reported[-1] = record.model
            if stage.local_head is not None:
                reported[me.stage] = record.local
        dist.all_reduce(reported)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        result.losses.append(float(reported[-1]))
        result.local_losses.append(reported[:-1].tolist())
        result.step_s.append(float(elapsed))
        result.operations = record.operations
        report_progress(ctx, json.dumps({"step": step, "loss": float(reported[-1]),
                                         "step_s": float(elapsed)}))
    if config.return_weights:
        result.weights = {index: _copy(layer) for index, layer in stage.layers.items()}
        result.local_head = {} if stage.local_head is None else _copy(stage.local_head)
    return result


def _copy(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in module.named_parameters()}
