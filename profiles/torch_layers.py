"""The layers hetplan profiles and launches, in PyTorch, with Megatron-style TP.

`build_layer(spec, kind, layer_index=...)` returns one pipeline layer:

- `embedding`: token ids `[b, s]` -> hidden `[b, s, h]`;
- `block`: hidden -> hidden (GPT: LayerNorm, attention, GELU MLP; Llama:
  RMSNorm, attention with rotary positions, SwiGLU MLP);
- `head`: (hidden, labels `[b, s]`) -> scalar mean cross-entropy (final
  norm, LM head, loss);
- `local_head`: the same computation with weights of its own, the auxiliary
  head a block trains through under local learning (schedule `local`). Its
  `layer_index` is the layer whose output it reads, the last of its block.

Initialization is deterministic and independent of the TP degree: the full
weights of layer `layer_index` are drawn from a CPU `torch.Generator` seeded
by `(seed, layer_index)` (a local head's from `(seed, num_layers +
layer_index)`, so it never shares a layer's draws), always in the same order,
and each rank keeps its shard. So a TP=2 run starts from exactly the weights a TP=1 run starts from.

Tensor parallelism follows Shoeybi et al. (2019), Megatron-LM: QKV and MLP-up
(and SwiGLU gate) are column-parallel, attention-out and MLP-down are
row-parallel. `_CopyToTensorParallel` ("f") is the identity forward and an
all-reduce of the input gradient backward; `_ReduceFromTensorParallel` ("g")
all-reduces the row-parallel partial outputs forward and is the identity
backward. Biases of row-parallel layers are added once, after the reduce.
Embedding and both heads are replicated on every TP rank.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from profiles.models import (
    BLOCK,
    EMBEDDING,
    HEAD,
    KINDS,
    LOCAL_HEAD,
    PRESETS,
    ModelSpec,
    check_tp,
    get_preset,
    layer_kinds,
    layer_params,
)

__all__ = [
    "ModelSpec",
    "PRESETS",
    "get_preset",
    "layer_kinds",
    "layer_params",
    "build_layer",
    "layer_seed",
    "shard_tensor",
    "Embedding",
    "GptBlock",
    "LlamaBlock",
    "Head",
    "LocalHead",
]

INIT_STD = 0.02


def layer_seed(seed: int, layer_index: int) -> int:
    """The generator seed of layer `layer_index`: distinct per (seed, layer) pair."""
    # A large odd multiplier keeps (seed, layer) pairs from colliding for any
    # realistic layer count.
    return (seed * 1_000_003 + layer_index) % (2**63)


class _Init:
    """Draws full-size tensors from one seeded generator, in call order."""

    def __init__(self, seed: int, layer_index: int) -> None:
        self.generator = torch.Generator(device="cpu")
        self.generator.manual_seed(layer_seed(seed, layer_index))

    def normal(self, *shape: int, std: float = INIT_STD) -> torch.Tensor:
        out = torch.empty(*shape, dtype=torch.float32)
        return out.normal_(0.0, std, generator=self.generator)


class _CopyToTensorParallel(torch.autograd.Function):
    """Megatron's f: identity forward, all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTensorParallel(torch.autograd.Function):
    """Megatron's g: all-reduce forward (sum of partial outputs), identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        out = x.contiguous().clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _TensorParallel:
    """This rank's place in its TP group; with size 1 every collective is skipped."""

    def __init__(self, rank: int, size: int, group: Any) -> None:
        if not 0 <= rank < size:
            raise ValueError(f"tp_rank is {rank} but tp_size is {size}; need 0 <= tp_rank < size")
        if size > 1 and not dist.is_initialized():
            raise ValueError(
                f"tp_size={size} needs torch.distributed initialised (init_process_group) "
                "before build_layer; or use tp_size=1"
            )
        if size > 1 and dist.get_world_size(group) != size:
            raise ValueError(
                f"tp_size={size} but the TP process group has {dist.get_world_size(group)} "
                "ranks; pass the group of exactly this layer's TP ranks as tp_group"
            )
        # tp_rank need not equal the rank inside tp_group: it only picks the shard, and
        # the collectives are sums, so any one-to-one assignment of shards works.
        self.rank, self.size, self.group = rank, size, group

    def rows(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's slice of dim 0 (column-parallel output features)."""
        return _slice(full, 0, self.rank, self.size)

    def cols(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's slice of dim 1 (row-parallel input features)."""
        return _slice(full, 1, self.rank, self.size)

    def copy_in(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.size == 1 else _CopyToTensorParallel.apply(x, self.group)

    def reduce_out(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.size == 1 else _ReduceFromTensorParallel.apply(x, self.group)


# How each parameter is split under TP, by its attribute name; the rest are
# replicated. `shard_tensor` applies the same rules the modules use when they
# build their shards, so a full (TP=1) tensor can be compared with a rank's.
_SPLITS = {
    "qkv_weight": "qkv",
    "qkv_bias": "qkv",
    "up_weight": "rows",
    "up_bias": "rows",
    "gate_weight": "rows",
    "out_weight": "cols",
    "down_weight": "cols",
}


def shard_tensor(name: str, full: torch.Tensor, *, tp_rank: int, tp_size: int) -> torch.Tensor:
    """Rank `tp_rank`'s shard of the full parameter (or gradient) called `name`.

    `name` is a parameter name as `named_parameters()` gives it (e.g.
    `attn.qkv_weight`); only its last part decides the split.
    """
    split = _SPLITS.get(name.rsplit(".", 1)[-1])
    if split == "rows":
        return _slice(full, 0, tp_rank, tp_size)
    if split == "cols":
        return _slice(full, 1, tp_rank, tp_size)
    if split == "qkv":
        return torch.cat([_slice(part, 0, tp_rank, tp_size) for part in full.chunk(3, dim=0)])
    return full


def _slice(full: torch.Tensor, dim: int, rank: int, size: int) -> torch.Tensor:
    if full.shape[dim] % size:
        raise ValueError(f"dimension {dim} of size {full.shape[dim]} does not split {size} ways")
    return full.chunk(size, dim=dim)[rank].contiguous()


def _param(tensor: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(tensor)


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = _param(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def _norm(spec: ModelSpec) -> nn.Module:
    return nn.LayerNorm(spec.hidden) if spec.style == "gpt" else RMSNorm(spec.hidden)


class Embedding(nn.Module):
    """Token embedding, plus learned positions for GPT; replicated under TP."""

    def __init__(self, spec: ModelSpec, init: _Init) -> None:
        super().__init__()
        self.tokens = _param(init.normal(spec.vocab_size, spec.hidden))
        self.positions = (
            _param(init.normal(spec.seq_len, spec.hidden)) if spec.style == "gpt" else None
        )

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        hidden = F.embedding(token_ids, self.tokens)
        if self.positions is not None:
            hidden = hidden + self.positions[: token_ids.shape[1]]
        return hidden


class _Attention(nn.Module):
    """Causal self-attention over this rank's heads; QKV column-, out row-parallel."""

    rotary_cos: torch.Tensor
    rotary_sin: torch.Tensor

    def __init__(self, spec: ModelSpec, init: _Init, tp: _TensorParallel, out_std: float) -> None:
        super().__init__()
        h, bias = spec.hidden, spec.style == "gpt"
        self.tp = tp
        self.num_heads = spec.num_heads // tp.size
        self.head_dim = spec.head_dim
        # Full q, k, v drawn separately so a head's weights do not depend on tp.
        q, k, v = (init.normal(h, h) for _ in range(3))
        self.qkv_weight = _param(torch.cat([tp.rows(q), tp.rows(k), tp.rows(v)]))
        self.qkv_bias = _param(torch.zeros(3 * h // tp.size)) if bias else None
        self.out_weight = _param(tp.cols(init.normal(h, h, std=out_std)))
        self.out_bias = _param(torch.zeros(h)) if bias else None
        self.rotary = spec.style == "llama"
        if self.rotary:
            # Buffers, not attributes, so that build_layer's .to(device) moves them.
            cos, sin = _rotary_tables(spec)
            self.register_buffer("rotary_cos", cos, persistent=False)
            self.register_buffer("rotary_sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        qkv = F.linear(self.tp.copy_in(x), self.qkv_weight, self.qkv_bias)
        q, k, v = (
            t.view(b, s, self.num_heads, self.head_dim).transpose(1, 2) for t in qkv.chunk(3, -1)
        )
        if self.rotary:
            cos, sin = self.rotary_cos[:s].to(q.dtype), self.rotary_sin[:s].to(q.dtype)
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(b, s, self.num_heads * self.head_dim)
        out = self.tp.reduce_out(F.linear(y, self.out_weight))
        return out if self.out_bias is None else out + self.out_bias


def _rotary_tables(spec: ModelSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables of rotary embeddings (Su et al. 2021), base 10000."""
    half = spec.head_dim // 2
    inv_freq = 1.0 / (10000.0 ** (torch.arange(half, dtype=torch.float64) / half))
    angles = torch.outer(torch.arange(spec.seq_len, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-second, first], dim=-1) * sin


class _GeluMlp(nn.Module):
    def __init__(self, spec: ModelSpec, init: _Init, tp: _TensorParallel, out_std: float) -> None:
        super().__init__()
        h, f = spec.hidden, spec.ffn_hidden
        self.tp = tp
        self.up_weight = _param(tp.rows(init.normal(f, h)))
        self.up_bias = _param(torch.zeros(f // tp.size))
        self.down_weight = _param(tp.cols(init.normal(h, f, std=out_std)))
        self.down_bias = _param(torch.zeros(h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inner = F.gelu(F.linear(self.tp.copy_in(x), self.up_weight, self.up_bias))
        return self.tp.reduce_out(F.linear(inner, self.down_weight)) + self.down_bias


class _SwigluMlp(nn.Module):
    def __init__(self, spec: ModelSpec, init: _Init, tp: _TensorParallel, out_std: float) -> None:
        super().__init__()
        h, f = spec.hidden, spec.ffn_hidden
        self.tp = tp
        self.gate_weight = _param(tp.rows(init.normal(f, h)))
        self.up_weight = _param(tp.rows(init.normal(f, h)))
        self.down_weight = _param(tp.cols(init.normal(h, f, std=out_std)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.tp.copy_in(x)
        inner = F.silu(F.linear(x, self.gate_weight)) * F.linear(x, self.up_weight)
        return self.tp.reduce_out(F.linear(inner, self.down_weight))


class _Block(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then + mlp(norm(x))."""

    def __init__(self, spec: ModelSpec, init: _Init, tp: _TensorParallel) -> None:
        super().__init__()
        # GPT-2's scaled init of the residual projections keeps the stream's
        # variance from growing with depth.
        out_std = INIT_STD / (2 * spec.num_blocks) ** 0.5
        self.attn_norm = _norm(spec)
        self.attn = _Attention(spec, init, tp, out_std)
        self.mlp_norm = _norm(spec)
        mlp = _GeluMlp if spec.style == "gpt" else _SwigluMlp
        self.mlp = mlp(spec, init, tp, out_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class GptBlock(_Block):
    """GPT block: LayerNorm, attention with biases, GELU MLP."""


class LlamaBlock(_Block):
    """Llama block: RMSNorm, rotary attention without biases, SwiGLU MLP."""


class Head(nn.Module):
    """Final norm, LM head and mean cross-entropy; replicated under TP."""

    def __init__(self, spec: ModelSpec, init: _Init) -> None:
        super().__init__()
        self.norm = _norm(spec)
        self.weight = _param(init.normal(spec.vocab_size, spec.hidden))

    def forward(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = F.linear(self.norm(hidden), self.weight)
        # The loss in fp32 whatever the compute dtype, as mixed-precision training does.
        return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


class LocalHead(Head):
    """A block's auxiliary head under local learning: a `Head` with weights of its own."""


def build_layer(
    spec: ModelSpec,
    kind: str,
    *,
    layer_index: int,
    seed: int = 0,
    tp_rank: int = 0,
    tp_size: int = 1,
    tp_group: Any = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> nn.Module:
    """One layer of `spec`, initialised from `(seed, layer_index)`, sharded for `tp_rank`.

    `tp_group` is the process group of the TP ranks (None: the default group);
    it must have `tp_size` ranks. `tp_rank` picks which shard this process holds
    (0..tp_size-1, each exactly once in the group); it need not equal the
    process's rank inside `tp_group`. For `local_head`, `layer_index` is the layer whose
    output the head reads (any layer but the model's head).
    Weights are drawn in fp32 on the CPU, then cast to `dtype` and moved to
    `device`, so every dtype and device starts from the same values.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown layer kind {kind!r}; use one of {list(KINDS)}")
    _check_layer_index(spec, kind, layer_index)
    check_tp(spec, tp_size)
    tp = _TensorParallel(tp_rank, tp_size, tp_group)
    module: nn.Module
    if kind == LOCAL_HEAD:
        module = LocalHead(spec, _Init(seed, spec.num_layers + layer_index))
    elif kind == EMBEDDING:
        module = Embedding(spec, _Init(seed, layer_index))
    elif kind == BLOCK:
        module = (GptBlock if spec.style == "gpt" else LlamaBlock)(spec, _Init(seed, layer_index), tp)
    else:
        assert kind == HEAD
        module = Head(spec, _Init(seed, layer_index))
    return module.to(dtype=dtype, device=device)


def _check_layer_index(spec: ModelSpec, kind: str, layer_index: int) -> None:
    last = spec.num_layers - 1
    if kind == LOCAL_HEAD:
        if not 0 <= layer_index < last:
            raise ValueError(f"a local head reads the output of layer {layer_index}, but "
                             f"{spec.name}'s layers before its head are 0..{last - 1}; attach it "
                             "to the last layer of a block that is not the last")
        return
    if not 0 <= layer_index <= last:
        raise ValueError(
            f"layer_index {layer_index} is outside {spec.name}'s {spec.num_layers} layers "
            f"(0..{last})"
        )
    expected = layer_kinds(spec)[layer_index]
    if expected != kind:
        raise ValueError(f"layer {layer_index} of {spec.name} is a {expected!r}, not {kind!r}")
