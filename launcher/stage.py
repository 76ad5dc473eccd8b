"""One rank's share of a stage, and the schedule that runs it for one step.

A stage holds one layer range, or several chunks under interleaved-1f1b (model
chunk `c = j * S + s` is chunk `j` of stage `s`). `run_schedule` runs every
(model chunk, direction, micro-batch) operation in the order the estimator
simulates (`planner.simulate.stage_operations`, the same function), so what
runs is what was estimated:

- forward of chunk `c`: its input is the token ids (`c = 0`) or chunk
  `c - 1`'s output, received from the first GPU of stage `(c - 1) mod S` (the
  last stage hands chunk `S - 1`'s output back to the first); its output goes
  to stage `(c + 1) mod S`. With one stage every chunk is on this rank and the
  hand-off stays in the process.
- backward of chunk `c`: the gradient of its output comes from chunk `c + 1`
  and the gradient of its input goes back to chunk `c - 1`; the last chunk
  starts from its loss, scaled by `micro_batch_size / global_batch` (see
  `launcher.runtime`).
- `local` (PPLL): a stage's backward runs its local head on the stage's own
  output and backpropagates that head's scaled loss through the stage alone;
  the output went forward detached and nothing is sent backward, so no
  gradient crosses a block boundary. The last stage trains on the model's head.
- `recompute`: the forward runs without autograd and keeps only its input; the
  backward runs the forward again, with autograd, just before it.

Point-to-point messages go between the first GPUs of two stages, which
broadcast what they receive over their TP group; sends do not block, so two
neighbours that both send never wait on each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from planner.documents import LayerRange, Plan, Schedule
from planner.export.ranks import PipelineShare, RankInfo, RankMap
from planner.simulate import FORWARD, Operation, stage_operations
from profiles.models import HEAD, LOCAL_HEAD, ModelSpec, layer_kinds
from profiles.torch_layers import build_layer

__all__ = ["StageRole", "StepRecord", "build_stage", "run_schedule"]


@dataclass(kw_only=True)
class StageRole:
    """This rank's share of one stage: its chunks' layers, its local head, its neighbours."""

    me: RankInfo
    spec: ModelSpec
    kinds: list[str]
    chunks: list[LayerRange]
    """The stage's layer ranges, chunk `j` first to last."""
    layers: dict[int, nn.Module]
    local_head: nn.Module | None
    """Under `local`, on every stage but the last: the head this block trains through."""
    recompute: bool
    num_stages: int
    leaders: list[int]
    """First GPU of every stage of the pipeline: the ranks that exchange messages."""
    stage_ranks: tuple[int, ...]
    tp_group: Any

    @property
    def leader(self) -> bool:
        return self.me.tp_rank == 0

    @property
    def last_layer(self) -> int:
        return self.chunks[-1][1] - 1

    def run_chunk(self, model_chunk: int, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        start, end = self.chunks[model_chunk // self.num_stages]
        for index in range(start, end):
            x = self.layers[index](x, labels) if self.kinds[index] == HEAD else self.layers[index](x)
        return x

    def share(self, tensor: torch.Tensor) -> None:
        """Broadcast the leader's tensor to the whole TP group, in place."""
        if self.me.tp_size > 1:
            dist.broadcast(tensor, src=self.stage_ranks[0], group=self.tp_group)


def build_stage(plan: Plan, ranks: RankMap, rank: int, spec: ModelSpec, *, seed: int,
                schedule: Schedule, tp_group: Any) -> StageRole:
    me = ranks.ranks[rank]
    kinds = layer_kinds(spec)
    pipeline = plan.pipelines[me.pipeline]
    stage = pipeline.stages[me.stage]
    num_stages = len(pipeline.stages)
    layers = {
        index: build_layer(spec, kinds[index], layer_index=index, seed=seed, tp_rank=me.tp_rank,
                           tp_size=me.tp_size, tp_group=tp_group)
        for start, end in stage.ranges for index in range(start, end)
    }
    local = schedule is Schedule.LOCAL and me.stage < num_stages - 1
    # Replicated under TP, as the model's head is: every TP rank holds all of it.
    head = build_layer(spec, LOCAL_HEAD, layer_index=stage.ranges[-1][1] - 1, seed=seed) \
        if local else None
    return StageRole(
        me=me, spec=spec, kinds=kinds, chunks=list(stage.ranges), layers=layers, local_head=head,
        recompute=stage.recompute, num_stages=num_stages,
        leaders=[ranks.stage_ranks(me.pipeline, s)[0] for s in range(num_stages)],
        stage_ranks=ranks.stage_ranks(me.pipeline, me.stage), tp_group=tp_group)


@dataclass(kw_only=True)
class StepRecord:
    """What one step ran on this rank: batch-weighted loss sums of its micro-batches, and its
    operations in the order they ran."""

    model: float = 0.0
    """The model's head (on the rank that holds it): summed over every rank's share, the mean
    loss over the global batch."""
    local: float = 0.0
    """This stage's local head, under `local`."""
    operations: list[Operation] = field(default_factory=list)
    """(model chunk, direction, micro-batch), as `planner.simulate.Operation`."""


@dataclass(kw_only=True)
class _Messages:
    """Activations and gradients between model chunks: to other stages' first GPUs, or kept in
    the process when the neighbouring chunk is on this stage (one-stage interleaving)."""

    stage: StageRole
    hidden_shape: tuple[int, ...]
    kept: dict[int, torch.Tensor] = field(default_factory=dict)
    sends: list[Any] = field(default_factory=list)

    def send(self, tensor: torch.Tensor, to_chunk: int, tag: int) -> None:
        to_stage = to_chunk % self.stage.num_stages
        if to_stage == self.stage.me.stage:
            self.kept[tag] = tensor
        elif self.stage.leader:
            # isend: a blocking send could wait on a neighbour that is itself sending.
            self.sends.append(dist.isend(tensor.contiguous(), dst=self.stage.leaders[to_stage],
                                         tag=tag))

    def receive(self, from_chunk: int, tag: int) -> torch.Tensor:
        from_stage = from_chunk % self.stage.num_stages
        if from_stage == self.stage.me.stage:
            return self.kept.pop(tag)
        tensor = torch.empty(self.hidden_shape)
        if self.stage.leader:
            dist.recv(tensor, src=self.stage.leaders[from_stage], tag=tag)
        self.stage.share(tensor)
        return tensor

    def wait(self) -> None:
        for work in self.sends:
            work.wait()


def run_schedule(stage: StageRole, share: PipelineShare, schedule: Schedule,
                 tokens: torch.Tensor, labels: torch.Tensor, global_batch_size: int
                 ) -> StepRecord:
    """Every forward and backward of this stage's chunks and micro-batches, in schedule order."""
    b, m = share.micro_batch_size, share.num_micro_batches
    num_chunks = len(stage.chunks)
    last_chunk = stage.num_stages * num_chunks - 1
    local = schedule is Schedule.LOCAL
    weight = b / global_batch_size
    messages = _Messages(stage=stage, hidden_shape=(b, stage.spec.seq_len, stage.spec.hidden))
    # Per (chunk, micro-batch) in flight: its input, and its output unless recomputed.
    held: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor | None]] = {}
    record = StepRecord()

    def tag(lower_chunk: int, i: int, direction: int) -> int:
        """Unique per message: the hop between chunks `lower_chunk` and `lower_chunk + 1`."""
        return 2 * (lower_chunk * m + i) + direction

    operations = stage_operations(stage.me.stage, stage.num_stages, m, schedule, num_chunks)
    for chunk, direction, i in operations:
        record.operations.append((chunk, direction, i))
        rows = slice(share.first_sample + i * b, share.first_sample + (i + 1) * b)
        if direction == FORWARD:
            x = tokens[rows] if chunk == 0 else messages.receive(chunk - 1, tag(chunk - 1, i, 0))
            if chunk > 0 and not local:
                x.requires_grad_(True)  # its gradient goes back to the previous chunk
            with torch.set_grad_enabled(not stage.recompute):
                out = stage.run_chunk(chunk, x, labels[rows])
            if chunk == last_chunk:
                record.model += weight * out.item()
            else:
                messages.send(out.detach(), chunk + 1, tag(chunk, i, 0))
            held[chunk, i] = (x, None if stage.recompute else out)
            continue
        x, kept_out = held.pop((chunk, i))
        if kept_out is None:
            x = x.detach().requires_grad_(x.requires_grad)
            out = stage.run_chunk(chunk, x, labels[rows])
        else:
            out = kept_out
        if chunk == last_chunk:
            (out * weight).backward()
        elif local:
            assert stage.local_head is not None, "built on every stage but the last"
            loss = stage.local_head(out, labels[rows])
            record.local += weight * loss.item()
            (loss * weight).backward()
        else:
            out.backward(messages.receive(chunk + 1, tag(chunk, i, 1)))
        if chunk > 0 and not local:
            assert x.grad is not None
            messages.send(x.grad, chunk - 1, tag(chunk - 1, i, 1))
    messages.wait()
    return record

