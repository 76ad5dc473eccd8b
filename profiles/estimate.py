"""Estimated profile rows from datasheet figures: the reference efficiency model.

No torch, no I/O: the GPU catalogue is passed in (see `profiles.reference`).
Each row is labelled `x_source: "estimated"`. The model, per layer and
micro-batch, on one GPU of a TP group of `tp`:

    compute_ms  = flops / tp_share / (peak_tflops * compute_efficiency)
    memory_ms   = bytes_moved / (memory_gb_per_s * memory_efficiency)
    forward_ms  = max(compute_ms, memory_ms) + overhead_ms + tp_comm_ms
    backward_ms = same with 2x the FLOPs and bytes (grads of inputs and weights)

- FLOPs are Megatron's matmul counts (Narayanan et al. 2021, eq. 3, derived
  per layer): a block's forward does `2*s*h*(4h + k*f) + 4*s^2*h` FLOPs per
  sample, `k` = 2 for a GELU MLP (up, down), 3 for SwiGLU (gate, up, down);
  the head (and a local head, built the same) `2*s*h*V`; the embedding is a
  gather with no matmul.
- Bytes moved: the layer's local weights once, plus its saved activations
  written once and the input read once; the embedding's backward also
  writes its dense `V x h` gradient. A floor for memory-bound layers only.
- `activation_bytes` follows Korthikanti et al. (2022, section 4.1) counted
  for the layers `profiles.torch_layers` builds: no dropout (so no masks),
  fused attention (no `s x s` scores kept), norm statistics, PyTorch's
  composite RMSNorm and the fp32 log-softmax of the loss included. The test suite checks the formula against
  the saved-tensor bytes of the real modules, which it matches to the byte.
- Tensor parallelism shards the block (Megatron), with two all-reduces of
  the `b*s*h` activation forward and two backward, each a ring:
  `2(tp-1)/tp * bytes / (bandwidth * link_efficiency) + 2(tp-1) * latency`.
  Embedding and head are replicated (as built), so their time does not shrink.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from profiles.models import BLOCK, EMBEDDING, HEAD, LOCAL_HEAD, ModelSpec, check_tp, layer_params
from profiles.models import output_bytes_per_sample as _output_bytes
from profiles.rows import ESTIMATED

__all__ = [
    "ESTIMATE_VERSION",
    "GpuSpec",
    "EfficiencyModel",
    "forward_flops",
    "activation_bytes",
    "estimate_times_ms",
    "estimate_row",
    "estimate_rows",
    "DTYPE_BYTES",
    "DEFAULT_EFFICIENCY",
]

ESTIMATE_VERSION = "hetplan-estimate/1"
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True, kw_only=True)
class GpuSpec:
    """Datasheet figures of one GPU type."""

    name: str
    memory_gib: float
    peak_tflops: float
    """Dense FP16/BF16 tensor-core peak, TFLOP/s."""
    memory_gb_per_s: float
    intra_node_gb_per_s: float
    """Per-direction bandwidth between two GPUs of one node."""
    intra_node_latency_us: float
    compute_dtype: str = "bfloat16"


@dataclass(frozen=True, kw_only=True)
class EfficiencyModel:
    """Fractions of datasheet peaks that training kernels reach; see README.md."""

    compute_efficiency: float = 0.55
    """Fraction of peak tensor FLOP/s the matmuls of a layer reach. Megatron-LM
    reports 52% of A100 peak for a whole GPT training iteration (bubbles and
    communication included), so single-layer GEMMs a bit above that."""
    memory_efficiency: float = 0.7
    """Fraction of datasheet memory bandwidth streaming kernels reach."""
    link_efficiency: float = 0.75
    """Fraction of the link's per-direction bandwidth NCCL's ring all-reduce
    reaches as bus bandwidth (nccl-tests on NVLink A100 reach about 230 of 300 GB/s)."""
    overhead_ms: float = 0.02
    """Fixed cost per layer and pass: kernel launches and small element-wise ops."""


DEFAULT_EFFICIENCY = EfficiencyModel()


def forward_flops(spec: ModelSpec, kind: str, micro_batch: int) -> float:
    """Matmul FLOPs of one forward of a full layer (Megatron's counting, causal ignored)."""
    s, h, f, v = spec.seq_len, spec.hidden, spec.ffn_hidden, spec.vocab_size
    if kind == EMBEDDING:
        return 0.0
    if kind == BLOCK:
        mlp_mats = 2 if spec.style == "gpt" else 3
        return micro_batch * (2 * s * h * (4 * h + mlp_mats * f) + 4 * s * s * h)
    if kind in (HEAD, LOCAL_HEAD):
        return micro_batch * 2 * s * h * v
    raise ValueError(f"unknown layer kind {kind!r}")


def activation_bytes(
    spec: ModelSpec, kind: str, micro_batch: int, tp: int, *, dtype_bytes: int
) -> int:
    """What autograd keeps for backward of one micro-batch on one GPU of the TP group."""
    check_tp(spec, tp)
    tokens = micro_batch * spec.seq_len
    h, f, d = spec.hidden, spec.ffn_hidden, dtype_bytes
    gpt = spec.style == "gpt"
    fp32, ids = 4, 8
    if kind == EMBEDDING:
        return tokens * ids  # the token ids, for the gradient scatter
    # Per norm: LayerNorm keeps its input and fp32 mean and rstd; PyTorch's
    # composite RMSNorm keeps its input, x * rstd and the fp32 rstd. The next
    # matmul keeps the norm's output in both cases.
    norm_elements = 2 * h if gpt else 3 * h
    norm_stats = (2 if gpt else 1) * fp32
    if kind == BLOCK:
        # Sharded attention tensors: the fused QKV output (q, k, v are views of
        # it) and the attention output; Llama also keeps the rotated q and k.
        attention = 4 * h if gpt else 6 * h
        # MLP hidden tensors: GELU's input and output; SwiGLU's gate,
        # silu(gate), up, and their product.
        mlp = (2 if gpt else 4) * f
        elements = 2 * norm_elements + (attention + mlp) // tp
        lse = spec.num_heads // tp * fp32  # attention's log-sum-exp per head and token
        # Llama's rotary cos/sin tables, kept once whatever the batch.
        rotary = 0 if gpt else 2 * spec.seq_len * spec.head_dim * d
        return tokens * (elements * d + 2 * norm_stats + lse) + rotary
    if kind in (HEAD, LOCAL_HEAD):
        # The final norm, the fp32 log-softmax over the vocabulary, the labels;
        # plus the 4-byte total weight of the mean loss.
        return tokens * (norm_elements * d + norm_stats + spec.vocab_size * fp32 + ids) + 4
    raise ValueError(f"unknown layer kind {kind!r}")


def _tp_comm_ms(bytes_: float, tp: int, gpu: GpuSpec, eff: EfficiencyModel) -> float:
    if tp == 1:
        return 0.0
    bandwidth = gpu.intra_node_gb_per_s * eff.link_efficiency * 1e9
    ring = 2 * (tp - 1) / tp * bytes_ / bandwidth + 2 * (tp - 1) * gpu.intra_node_latency_us * 1e-6
    return ring * 1e3


def estimate_times_ms(
    spec: ModelSpec, gpu: GpuSpec, kind: str, micro_batch: int, tp: int,
    eff: EfficiencyModel = DEFAULT_EFFICIENCY,
) -> tuple[float, float]:
    """(forward_ms, backward_ms) of one micro-batch on one GPU of the TP group."""
    d = DTYPE_BYTES[gpu.compute_dtype]
    sharded = kind == BLOCK
    share = tp if sharded else 1
    flops = forward_flops(spec, kind, micro_batch) / share
    weights = layer_params(spec, kind) / share * d
    tokens = micro_batch * spec.seq_len
    moved = weights + activation_bytes(spec, kind, micro_batch, tp if sharded else 1,
                                       dtype_bytes=d) + tokens * spec.hidden * d
    backward_extra = spec.vocab_size * spec.hidden * 4 if kind == EMBEDDING else 0
    peak = gpu.peak_tflops * 1e12 * eff.compute_efficiency
    bandwidth = gpu.memory_gb_per_s * 1e9 * eff.memory_efficiency
    comm = 2 * _tp_comm_ms(tokens * spec.hidden * d, tp, gpu, eff) if sharded else 0.0
    forward = max(flops / peak, moved / bandwidth) * 1e3 + eff.overhead_ms + comm
    backward = (max(2 * flops / peak, (2 * moved + backward_extra) / bandwidth) * 1e3
                + eff.overhead_ms + comm)
    return forward, backward


def estimate_row(
    spec: ModelSpec, gpu: GpuSpec, kind: str, micro_batch: int, tp: int,
    eff: EfficiencyModel = DEFAULT_EFFICIENCY,
) -> dict[str, Any]:
    """One docs/formats.md profile row, labelled estimated, with what it rests on."""
    forward, backward = estimate_times_ms(spec, gpu, kind, micro_batch, tp, eff)
    d = DTYPE_BYTES[gpu.compute_dtype]
    return {
        "gpu_type": gpu.name,
        "kind": kind,
        "micro_batch": micro_batch,
        "tp": tp,
        "forward_ms": round(forward, 4),
        "backward_ms": round(backward, 4),
        "activation_bytes": activation_bytes(spec, kind, micro_batch,
                                             tp if kind == BLOCK else 1, dtype_bytes=d),
        "x_source": ESTIMATED,
        "x_estimate": ESTIMATE_VERSION,
        "x_model": spec.name,
        "x_dtype": gpu.compute_dtype,
        "x_params": layer_params(spec, kind),
        "x_output_bytes_per_sample": _output_bytes(spec, kind, dtype_bytes=d),
    }


def estimate_rows(
    spec: ModelSpec,
    gpus: list[GpuSpec],
    *,
    micro_batches: tuple[int, ...],
    tp_sizes: tuple[int, ...],
    kinds: tuple[str, ...] = (EMBEDDING, BLOCK, HEAD),
    eff: EfficiencyModel = DEFAULT_EFFICIENCY,
) -> list[dict[str, Any]]:
    """Rows for every GPU, kind, micro-batch and TP degree the model can be split into."""
    rows = []
    for gpu in gpus:
        for tp in tp_sizes:
            if spec.num_heads % tp or spec.ffn_hidden % tp:
                continue  # this model cannot be split tp ways; no row rather than a wrong one
            for kind in kinds:
                for b in micro_batches:
                    rows.append(estimate_row(spec, gpu, kind, b, tp, eff))
    return rows
