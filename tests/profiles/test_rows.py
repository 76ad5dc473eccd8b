"""Statistics and row assembly of measured points; pure, no torch."""

from __future__ import annotations

import pytest

from profiles.rows import (
    LayerPoint,
    Summary,
    kinds_from_rows,
    merge_ranks,
    point_row,
    summarize,
)


def point(tp_rank_forward: float, *, activation: int = 100, spread: float = 0.0) -> LayerPoint:
    return LayerPoint(
        kind="block", micro_batch=2, tp=2,
        forward=Summary(median_ms=tp_rank_forward, spread_ms=spread, num_samples=5),
        backward=Summary(median_ms=2 * tp_rank_forward, spread_ms=0.0, num_samples=5),
        activation_bytes=activation, params=1000, local_params=500,
        output_bytes_per_sample=64, wall_s=0.5,
    )


def test_summarize_gives_median_and_interquartile_range() -> None:
    summary = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert summary.median_ms == 3.0
    assert summary.spread_ms == 2.0  # p75 4.0 - p25 2.0: the outlier does not count
    assert summary.num_samples == 5


def test_noisy_when_spread_exceeds_threshold_of_median() -> None:
    assert Summary(median_ms=1.0, spread_ms=0.2, num_samples=5).noisy(0.1)
    assert not Summary(median_ms=1.0, spread_ms=0.05, num_samples=5).noisy(0.1)


def test_summarize_rejects_empty_and_negative_samples() -> None:
    with pytest.raises(ValueError, match="at least one repeat"):
        summarize([])
    with pytest.raises(ValueError, match="not monotonic"):
        summarize([1.0, -0.5])


def test_merge_takes_the_slowest_rank() -> None:
    merged = merge_ranks([point(1.0, activation=100, spread=0.1),
                          point(1.5, activation=120, spread=0.05)])
    assert merged.forward.median_ms == 1.5
    assert merged.forward.spread_ms == 0.1
    assert merged.activation_bytes == 120


def test_merge_refuses_different_points() -> None:
    other = LayerPoint(**{**point(1.0).__dict__, "micro_batch": 4})
    with pytest.raises(ValueError, match="cannot merge"):
        merge_ranks([point(1.0), other])


def test_row_has_the_cost_model_fields_and_labels() -> None:
    row = point_row(point(1.0, spread=0.3), gpu_type="cpu", device_name="cpu: test",
                    model="tiny-gpt", dtype="float32", noise_threshold=0.1,
                    timer="perf_counter")
    assert {k: row[k] for k in ("gpu_type", "kind", "micro_batch", "tp", "forward_ms",
                                "backward_ms", "activation_bytes")} == {
        "gpu_type": "cpu", "kind": "block", "micro_batch": 2, "tp": 2, "forward_ms": 1.0,
        "backward_ms": 2.0, "activation_bytes": 100}
    assert row["x_source"] == "measured"
    assert row["x_noisy"] is True
    assert all(k.startswith("x_") for k in row if k not in
               ("gpu_type", "kind", "micro_batch", "tp", "forward_ms", "backward_ms",
                "activation_bytes"))


def test_row_with_zero_time_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot resolve"):
        point_row(point(0.0), gpu_type="cpu", device_name="x", model="m", dtype="float32",
                  noise_threshold=0.1, timer="perf_counter")


def test_kinds_from_rows() -> None:
    row = point_row(point(1.0), gpu_type="cpu", device_name="x", model="m", dtype="float32",
                    noise_threshold=0.1, timer="perf_counter")
    assert kinds_from_rows([row]) == {"block": {"params": 1000, "output_bytes_per_sample": 64}}
    with pytest.raises(ValueError, match="lacks x_params"):
        kinds_from_rows([{"kind": "block"}])
