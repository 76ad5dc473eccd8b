"""Model descriptions for profiling and reference estimates; pure, no torch.

A `ModelSpec` names the shape of a GPT- or Llama-style decoder. Its layers are
`embedding, block * num_blocks, head`, the same kinds the scenario document's
`model.layers` uses. Parameter counts here are the exact counts of the modules
`profiles.torch_layers.build_layer` builds (a test pins that), so reference
rows and measured rows describe the same layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "EMBEDDING",
    "BLOCK",
    "HEAD",
    "LOCAL_HEAD",
    "KINDS",
    "STYLES",
    "ModelSpec",
    "PRESETS",
    "get_preset",
    "layer_kinds",
    "layer_params",
    "output_bytes_per_sample",
    "check_tp",
]

EMBEDDING = "embedding"
BLOCK = "block"
HEAD = "head"
LOCAL_HEAD = "local_head"
"""The auxiliary head of local learning (schedule `local`): every block but the last trains
through one. It is no layer of the model (`layer_kinds` never lists it); a scenario names it
in `job.local_head_kind`. Built like `head` (final norm, LM projection, cross-entropy): the
local loss predicts the same next tokens from the block's output."""
KINDS = (EMBEDDING, BLOCK, HEAD, LOCAL_HEAD)
STYLES = ("gpt", "llama")

Style = Literal["gpt", "llama"]


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Shape of a decoder-only transformer, enough to build and count its layers."""

    name: str
    """Preset or model name; it becomes the scenario's `model.name`."""
    style: str
    """`"gpt"`: learned positions, LayerNorm, GELU MLP, biases. `"llama"`: rotary
    positions, RMSNorm, SwiGLU MLP, no biases."""
    vocab_size: int
    """Rows of the embedding and of the LM head (padded vocabulary)."""
    hidden: int
    """Width of the residual stream, `h`."""
    num_heads: int
    """Attention heads; must divide `hidden` and be divisible by the TP degree."""
    ffn_hidden: int
    """Inner width of the MLP; must be divisible by the TP degree."""
    num_blocks: int
    """Transformer blocks between embedding and head."""
    seq_len: int
    """Tokens per sample the layers are built and profiled for."""

    def __post_init__(self) -> None:
        if self.style not in STYLES:
            raise ValueError(f"ModelSpec.style is {self.style!r}; use one of {list(STYLES)}")
        for name in ("vocab_size", "hidden", "num_heads", "ffn_hidden", "num_blocks", "seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"ModelSpec.{name} is {getattr(self, name)}; it must be >= 1")
        if self.hidden % self.num_heads:
            raise ValueError(
                f"ModelSpec.hidden ({self.hidden}) is not divisible by num_heads "
                f"({self.num_heads}); choose a head count that divides the hidden size"
            )
        if self.style == "llama" and self.head_dim % 2:
            raise ValueError(
                f"llama-style head_dim ({self.head_dim}) must be even for rotary embeddings"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden // self.num_heads

    @property
    def num_layers(self) -> int:
        return self.num_blocks + 2


# GPT shapes follow Brown et al. (2020) Table 2.1 with Megatron's padded
# vocabulary (50304, a multiple of 128); gpt-1.3b takes 16 heads (head size
# 128), as Megatron-DeepSpeed's example configs do, since the paper's 24 heads
# do not divide 2048. Llama shapes follow Touvron et al. (2023) with its
# 32000-token vocabulary and the SwiGLU widths of the released checkpoints.
PRESETS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(name="tiny-gpt", style="gpt", vocab_size=256, hidden=64, num_heads=4,
                  ffn_hidden=256, num_blocks=2, seq_len=32),
        ModelSpec(name="tiny-llama", style="llama", vocab_size=256, hidden=64, num_heads=4,
                  ffn_hidden=172, num_blocks=2, seq_len=32),
        # Big enough that compute, not Python, dominates a layer on one CPU core
        # (milliseconds per layer), small enough for a CPU benchmark.
        ModelSpec(name="small-gpt", style="gpt", vocab_size=2048, hidden=256, num_heads=8,
                  ffn_hidden=1024, num_blocks=4, seq_len=128),
        ModelSpec(name="gpt-350m", style="gpt", vocab_size=50304, hidden=1024, num_heads=16,
                  ffn_hidden=4096, num_blocks=24, seq_len=2048),
        ModelSpec(name="gpt-1.3b", style="gpt", vocab_size=50304, hidden=2048, num_heads=16,
                  ffn_hidden=8192, num_blocks=24, seq_len=2048),
        ModelSpec(name="gpt-2.7b", style="gpt", vocab_size=50304, hidden=2560, num_heads=32,
                  ffn_hidden=10240, num_blocks=32, seq_len=2048),
        ModelSpec(name="gpt-6.7b", style="gpt", vocab_size=50304, hidden=4096, num_heads=32,
                  ffn_hidden=16384, num_blocks=32, seq_len=2048),
        ModelSpec(name="llama-7b", style="llama", vocab_size=32000, hidden=4096, num_heads=32,
                  ffn_hidden=11008, num_blocks=32, seq_len=2048),
        ModelSpec(name="llama-13b", style="llama", vocab_size=32000, hidden=5120, num_heads=40,
                  ffn_hidden=13824, num_blocks=40, seq_len=2048),
    )
}


def get_preset(name: str) -> ModelSpec:
    """The preset called `name`, or a `KeyError` that lists the known presets."""
    try:
        return PRESETS[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; use one of {sorted(PRESETS)}") from None


def layer_kinds(spec: ModelSpec) -> list[str]:
    """Kind of each layer, in order: embedding, the blocks, head (never the local head)."""
    return [EMBEDDING, *([BLOCK] * spec.num_blocks), HEAD]


def layer_params(spec: ModelSpec, kind: str) -> int:
    """Parameters of one full (unsharded) layer of `kind`."""
    h, f, v = spec.hidden, spec.ffn_hidden, spec.vocab_size
    gpt = spec.style == "gpt"
    if kind == EMBEDDING:
        return v * h + (spec.seq_len * h if gpt else 0)
    if kind == BLOCK:
        if gpt:
            # two LayerNorms (weight+bias), QKV and out with biases, MLP up/down with biases
            return 4 * h + (3 * h * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h)
        # two RMSNorms, QKV and out without biases, SwiGLU gate/up/down
        return 2 * h + 4 * h * h + 3 * h * f
    if kind in (HEAD, LOCAL_HEAD):
        return (2 * h if gpt else h) + h * v
    raise ValueError(f"unknown layer kind {kind!r}; use one of {list(KINDS)}")


def output_bytes_per_sample(spec: ModelSpec, kind: str, *, dtype_bytes: int) -> int:
    """Bytes a layer hands to the next one for one sample; heads hand on a loss only."""
    if kind in (HEAD, LOCAL_HEAD):
        return 0
    if kind in (EMBEDDING, BLOCK):
        return spec.seq_len * spec.hidden * dtype_bytes
    raise ValueError(f"unknown layer kind {kind!r}; use one of {list(KINDS)}")


def check_tp(spec: ModelSpec, tp_size: int) -> None:
    """Raise `ValueError` saying what to change when `spec` cannot be split `tp_size` ways."""
    if tp_size < 1:
        raise ValueError(f"tp_size is {tp_size}; it must be >= 1")
    if spec.num_heads % tp_size:
        raise ValueError(
            f"{spec.name}: num_heads ({spec.num_heads}) is not divisible by tp={tp_size}; "
            "use a TP degree that divides the head count"
        )
    if spec.ffn_hidden % tp_size:
        raise ValueError(
            f"{spec.name}: ffn_hidden ({spec.ffn_hidden}) is not divisible by tp={tp_size}; "
            "use a TP degree that divides the MLP width"
        )
