"""The reference efficiency model and the bundled rows; pure, no torch."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from profiles.estimate import (
    EfficiencyModel,
    activation_bytes,
    estimate_row,
    estimate_times_ms,
    forward_flops,
)
from profiles.models import PRESETS, layer_params
from profiles.reference import (
    REFERENCE_MICRO_BATCHES,
    REFERENCE_MODELS,
    gpu_specs,
    guess_gpu_type,
    reference_rows,
    rows_document,
)

ISSUE_GPUS = {"V100-16G", "V100-32G", "T4-16G", "A10-24G", "L4-24G", "L40S-48G", "A100-40G",
              "A100-80G", "H100-80G", "H200-141G"}


def test_gpt_block_flops_are_megatrons_24sh2_plus_4s2h() -> None:
    spec = PRESETS["gpt-1.3b"]
    s, h = spec.seq_len, spec.hidden
    assert forward_flops(spec, "block", 3) == 3 * (24 * s * h * h + 4 * s * s * h)


def test_parameter_counts_of_known_models() -> None:
    # gpt-1.3b's block as in tests/api/data/scenario.json: 12h^2 + 13h.
    assert layer_params(PRESETS["gpt-1.3b"], "block") == 12 * 2048**2 + 13 * 2048
    llama = PRESETS["llama-7b"]
    total = sum(layer_params(llama, kind) for kind in ("embedding", "head")) + \
        llama.num_blocks * layer_params(llama, "block")
    assert total == 6_738_415_616  # Llama-7B's published count


def test_activation_bytes_follow_korthikanti_without_dropout() -> None:
    # Korthikanti et al. (2022) eq. 2, bf16, f = 4h: s*b*h*(10 + 24/t) bytes, plus the
    # 5*a*s/h*t attention-score term. Fused attention drops the scores, no dropout drops
    # the two 1-byte masks (10 -> 8); fp32 norm statistics (16 bytes) and log-sum-exp
    # (4 bytes per local head) remain per token.
    spec = PRESETS["gpt-1.3b"]
    s, h, a, b = spec.seq_len, spec.hidden, spec.num_heads, 2
    for tp in (1, 2, 4):
        expected = s * b * h * (8 + 24 // tp) + s * b * (16 + 4 * a // tp)
        assert activation_bytes(spec, "block", b, tp, dtype_bytes=2) == expected


def test_estimated_times_grow_with_micro_batch_and_tp_shrinks_the_block() -> None:
    gpu = gpu_specs()["A100-80G"]
    spec = PRESETS["gpt-2.7b"]
    one, two = (estimate_times_ms(spec, gpu, "block", b, 1) for b in (1, 2))
    assert two[0] > one[0] and two[1] > one[1]
    tp2 = estimate_times_ms(spec, gpu, "block", 2, 2)
    assert tp2[0] < two[0]
    # ... but by less than half: two all-reduces per pass over NVLink.
    assert tp2[0] > two[0] / 2


def test_compute_bound_block_time_is_flops_over_efficient_peak() -> None:
    gpu = gpu_specs()["H100-80G"]
    spec = PRESETS["llama-13b"]
    eff = EfficiencyModel()
    forward, backward = estimate_times_ms(spec, gpu, "block", 4, 1, eff)
    compute_ms = forward_flops(spec, "block", 4) / (gpu.peak_tflops * 1e12 *
                                                   eff.compute_efficiency) * 1e3
    assert forward == pytest.approx(compute_ms + eff.overhead_ms)
    assert backward == pytest.approx(2 * compute_ms + eff.overhead_ms)


def test_every_row_is_labelled_estimated() -> None:
    row = estimate_row(PRESETS["gpt-350m"], gpu_specs()["T4-16G"], "head", 1, 1)
    assert row["x_source"] == "estimated"
    assert row["forward_ms"] > 0 and row["backward_ms"] > row["forward_ms"]


def test_catalogue_covers_the_issues_gpu_types() -> None:
    assert set(gpu_specs()) == ISSUE_GPUS


@pytest.mark.parametrize("model", REFERENCE_MODELS)
def test_bundled_rows_are_current_and_complete(model: str) -> None:
    text = resources.files("profiles.reference").joinpath(f"rows-{model}.json").read_text()
    assert json.loads(text) == rows_document(model), (
        "stale reference rows: run `python -m profiles.reference`")
    rows = reference_rows(model)
    assert {r["gpu_type"] for r in rows} == ISSUE_GPUS
    assert {r["micro_batch"] for r in rows} == set(REFERENCE_MICRO_BATCHES)
    assert all(r["x_source"] == "estimated" for r in rows)


def test_unknown_reference_model_names_the_bundled_ones() -> None:
    with pytest.raises(KeyError, match="bundled"):
        reference_rows("gpt-175b")


@pytest.mark.parametrize(("name", "memory", "expected"), [
    ("NVIDIA A100-SXM4-80GB", 79.2, "A100-80G"),
    ("NVIDIA A100-SXM4-40GB", 39.4, "A100-40G"),
    ("NVIDIA A10", 22.0, "A10-24G"),
    ("NVIDIA L40S", 44.5, "L40S-48G"),
    ("NVIDIA L4", 22.0, "L4-24G"),
    ("NVIDIA H200", 139.8, "H200-141G"),
    ("Tesla V100-SXM2-16GB", 15.8, "V100-16G"),
    ("AMD Instinct MI300X", 192.0, None),
])
def test_guess_gpu_type(name: str, memory: float, expected: str | None) -> None:
    assert guess_gpu_type(name, memory) == expected
