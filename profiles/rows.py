"""Profile rows as docs/formats.md defines them, and the statistics behind them; no torch.

A measured point becomes one row of the scenario's `profiles` list, with
hetplan's extensions under `x_` names (the documents keep unknown fields):

- `x_source`: `"measured"` or `"estimated"`, never left out;
- `x_device`: the device the row was measured on (`torch.cuda.get_device_name`
  or the CPU's name);
- `x_forward_spread_ms` / `x_backward_spread_ms`: interquartile range of the
  repeats; `x_noisy`: that spread exceeds the noise threshold of the median;
- `x_params`, `x_output_bytes_per_sample`: the layer's full parameter count and
  hand-off size, so a scenario's `model.kinds` can be rebuilt from rows alone.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MEASURED",
    "ESTIMATED",
    "Summary",
    "summarize",
    "LayerPoint",
    "SkippedPoint",
    "point_row",
    "merge_ranks",
    "kinds_from_rows",
]

MEASURED = "measured"
ESTIMATED = "estimated"


@dataclass(frozen=True, kw_only=True)
class Summary:
    """Median and spread of repeated timings of one operation."""

    median_ms: float
    spread_ms: float
    """Interquartile range (p75 - p25): robust to the odd descheduled repeat."""
    num_samples: int

    def noisy(self, threshold: float) -> bool:
        """True when the spread exceeds `threshold` times the median."""
        return self.spread_ms > threshold * self.median_ms


def summarize(samples_ms: Sequence[float]) -> Summary:
    """Median and interquartile range; one sample has no spread."""
    if not samples_ms:
        raise ValueError("no timing samples; use at least one repeat")
    if any(s < 0 for s in samples_ms):
        raise ValueError(f"negative timing in {list(samples_ms)}: the clock is not monotonic")
    if len(samples_ms) == 1:
        return Summary(median_ms=samples_ms[0], spread_ms=0.0, num_samples=1)
    q1, _, q3 = statistics.quantiles(samples_ms, n=4, method="inclusive")
    return Summary(median_ms=statistics.median(samples_ms), spread_ms=q3 - q1,
                   num_samples=len(samples_ms))


@dataclass(frozen=True, kw_only=True)
class LayerPoint:
    """One (kind, micro_batch, tp) measurement on one TP rank."""

    kind: str
    micro_batch: int
    tp: int
    forward: Summary
    backward: Summary
    activation_bytes: int
    """Bytes of the tensors autograd saved for backward, parameters excluded."""
    params: int
    """Parameters of the full layer (all TP ranks together)."""
    local_params: int
    """Parameters this rank holds."""
    output_bytes_per_sample: int
    wall_s: float
    """Wall time spent on this point: build, warm-up, repeats."""
    extra: tuple[tuple[str, Any], ...] = ()
    """More `x_` fields, e.g. allocator statistics on GPU."""


@dataclass(frozen=True, kw_only=True)
class SkippedPoint:
    kind: str
    micro_batch: int
    tp: int
    reason: str


def merge_ranks(per_rank: Sequence[LayerPoint]) -> LayerPoint:
    """One point from the same point on every rank of a TP group: the slowest rank counts.

    A TP step ends when its last rank finishes, so times and activation memory
    take the maximum over ranks, and the spread is the largest one seen.
    """
    if not per_rank:
        raise ValueError("no ranks to merge")
    first = per_rank[0]
    for p in per_rank:
        if (p.kind, p.micro_batch, p.tp) != (first.kind, first.micro_batch, first.tp):
            raise ValueError(f"cannot merge {p.kind}/{p.micro_batch}/{p.tp} with "
                             f"{first.kind}/{first.micro_batch}/{first.tp}")

    def worst(get: Any) -> Summary:
        slowest = max((get(p) for p in per_rank), key=lambda s: s.median_ms)
        spread = max(get(p).spread_ms for p in per_rank)
        return Summary(median_ms=slowest.median_ms, spread_ms=spread,
                       num_samples=slowest.num_samples)

    return LayerPoint(
        kind=first.kind, micro_batch=first.micro_batch, tp=first.tp,
        forward=worst(lambda p: p.forward), backward=worst(lambda p: p.backward),
        activation_bytes=max(p.activation_bytes for p in per_rank),
        params=first.params, local_params=max(p.local_params for p in per_rank),
        output_bytes_per_sample=first.output_bytes_per_sample,
        wall_s=max(p.wall_s for p in per_rank), extra=first.extra,
    )


def point_row(
    point: LayerPoint,
    *,
    gpu_type: str,
    device_name: str,
    model: str,
    dtype: str,
    noise_threshold: float,
    timer: str,
) -> dict[str, Any]:
    """The docs/formats.md profile row of a measured point, with its `x_` fields."""
    if point.forward.median_ms <= 0 or point.backward.median_ms <= 0:
        # A zero time means the clock could not resolve the operation; a row
        # claiming free compute would mislead the planner.
        raise ValueError(
            f"{point.kind} at micro_batch={point.micro_batch}, tp={point.tp} timed at "
            f"{point.forward.median_ms} / {point.backward.median_ms} ms; use a larger model "
            "or micro-batch, the clock cannot resolve it"
        )
    row: dict[str, Any] = {
        "gpu_type": gpu_type,
        "kind": point.kind,
        "micro_batch": point.micro_batch,
        "tp": point.tp,
        "forward_ms": round(point.forward.median_ms, 6),
        "backward_ms": round(point.backward.median_ms, 6),
        "activation_bytes": point.activation_bytes,
        "x_source": MEASURED,
        "x_device": device_name,
        "x_model": model,
        "x_dtype": dtype,
        "x_timer": timer,
        "x_repeats": point.forward.num_samples,
        "x_forward_spread_ms": round(point.forward.spread_ms, 6),
        "x_backward_spread_ms": round(point.backward.spread_ms, 6),
        "x_noisy": point.forward.noisy(noise_threshold) or point.backward.noisy(noise_threshold),
        "x_params": point.params,
        "x_local_params": point.local_params,
        "x_output_bytes_per_sample": point.output_bytes_per_sample,
        "x_profile_s": round(point.wall_s, 3),
    }
    row.update(dict(point.extra))
    return row


def kinds_from_rows(rows: Iterable[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """`model.kinds` recovered from rows that carry `x_params` and `x_output_bytes_per_sample`."""
    kinds: dict[str, dict[str, float]] = {}
    for row in rows:
        if "x_params" not in row or "x_output_bytes_per_sample" not in row:
            raise ValueError(f"row for {row.get('kind')!r} lacks x_params / "
                             "x_output_bytes_per_sample; profile with hetplan's profiler")
        kinds[row["kind"]] = {"params": row["x_params"],
                              "output_bytes_per_sample": row["x_output_bytes_per_sample"]}
    return kinds
