"""Check that a TP=n run of the layers equals a TP=1 run, on outputs and gradients.

Runs one forward and backward of the whole model (embedding, blocks, head) on
the same seeded batch, once in this process with TP=1 and once in `tp_size`
spawned processes (gloo on CPU, NCCL on GPU), then compares each rank's
outputs, input gradients, parameters and parameter gradients with the
matching shard of the TP=1 run. Used by the tests and by
`hetplan profile layers --check-tp`, so TP rows are only trusted on a setup
where the sharding is known to be right.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from profiles.distributed import DistContext, spawn
from profiles.torch_layers import ModelSpec, build_layer, layer_kinds, shard_tensor

__all__ = ["TpComparison", "RunRecord", "run_model_step", "compare_tensor_parallel"]


@dataclass(frozen=True, kw_only=True)
class RunRecord:
    """Tensors of one forward+backward of the whole model on one rank, on the CPU."""

    outputs: list[torch.Tensor]
    """Output of each layer; the last is the loss."""
    input_grads: list[torch.Tensor]
    """Gradient of the loss with respect to each block's and the head's input."""
    params: dict[str, torch.Tensor]
    """This rank's parameters, named `<layer index>.<name>`."""
    grads: dict[str, torch.Tensor]
    """Their gradients, same names."""


@dataclass(frozen=True, kw_only=True)
class TpComparison:
    """Largest absolute differences between TP=n ranks and TP=1 shards."""

    tp_size: int
    max_output_diff: float
    max_input_grad_diff: float
    max_param_diff: float
    max_grad_diff: float

    @property
    def max_diff(self) -> float:
        return max(self.max_output_diff, self.max_input_grad_diff, self.max_param_diff,
                   self.max_grad_diff)


def run_model_step(
    spec: ModelSpec,
    *,
    micro_batch: int,
    seed: int = 0,
    tp_rank: int = 0,
    tp_size: int = 1,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
) -> RunRecord:
    """Forward and backward of every layer of `spec` on one seeded batch."""
    kinds = layer_kinds(spec)
    layers = [
        build_layer(spec, kind, layer_index=i, seed=seed, tp_rank=tp_rank, tp_size=tp_size,
                    dtype=dtype, device=device)
        for i, kind in enumerate(kinds)
    ]
    data = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, spec.vocab_size, (micro_batch, spec.seq_len), generator=data)
    labels = torch.randint(0, spec.vocab_size, (micro_batch, spec.seq_len), generator=data)
    ids, labels = ids.to(device), labels.to(device)
    outputs, inputs = [], []
    hidden = layers[0](ids)
    outputs.append(hidden)
    for layer in layers[1:-1]:
        hidden.retain_grad()
        inputs.append(hidden)
        hidden = layer(hidden)
        outputs.append(hidden)
    hidden.retain_grad()
    inputs.append(hidden)
    loss = layers[-1](hidden, labels)
    outputs.append(loss)
    loss.backward()
    named = [(f"{i}.{n}", p) for i, layer in enumerate(layers) for n, p in layer.named_parameters()]
    return RunRecord(
        outputs=[t.detach().cpu() for t in outputs],
        input_grads=[_grad(t) for t in inputs],
        params={n: p.detach().cpu() for n, p in named},
        grads={n: _grad(p) for n, p in named},
    )


def _grad(tensor: torch.Tensor) -> torch.Tensor:
    assert tensor.grad is not None, "backward did not reach a tensor it should have"
    return tensor.grad.detach().cpu()


def _rank_step(ctx: DistContext, spec: ModelSpec, micro_batch: int, dtype: Any) -> RunRecord:
    return run_model_step(spec, micro_batch=micro_batch, tp_rank=ctx.rank,
                          tp_size=ctx.world_size, dtype=dtype, device=ctx.device)


def compare_tensor_parallel(
    spec: ModelSpec,
    *,
    tp_size: int,
    micro_batch: int = 2,
    dtype: torch.dtype = torch.float64,
    device: str = "cpu",
) -> TpComparison:
    """Run TP=1 here and TP=`tp_size` in spawned processes; their largest differences."""
    reference = run_model_step(spec, micro_batch=micro_batch, dtype=dtype, device=device)
    ranks = spawn(_rank_step, world_size=tp_size, device=device, args=(spec, micro_batch, dtype))
    diffs: dict[str, float] = {"out": 0.0, "in": 0.0, "param": 0.0, "grad": 0.0}
    for rank, record in enumerate(ranks):
        diffs["out"] = max(diffs["out"], _max_diff(record.outputs, reference.outputs))
        diffs["in"] = max(diffs["in"], _max_diff(record.input_grads, reference.input_grads))
        for key, field in (("param", "params"), ("grad", "grads")):
            mine, full = getattr(record, field), getattr(reference, field)
            if mine.keys() != full.keys():
                raise AssertionError(f"rank {rank} has parameters {sorted(mine)}, "
                                     f"TP=1 has {sorted(full)}")
            shards = [shard_tensor(n, full[n], tp_rank=rank, tp_size=tp_size) for n in mine]
            diffs[key] = max(diffs[key], _max_diff(list(mine.values()), shards))
    return TpComparison(tp_size=tp_size, max_output_diff=diffs["out"],
                        max_input_grad_diff=diffs["in"], max_param_diff=diffs["param"],
                        max_grad_diff=diffs["grad"])


def _max_diff(ours: list[torch.Tensor], theirs: list[torch.Tensor]) -> float:
    if len(ours) != len(theirs):
        raise AssertionError(f"{len(ours)} tensors against {len(theirs)}")
    worst = 0.0
    for a, b in zip(ours, theirs, strict=True):
        if a.shape != b.shape:
            raise AssertionError(f"shape {tuple(a.shape)} against {tuple(b.shape)}")
        worst = max(worst, (a.double() - b.double()).abs().max().item())
    return worst
