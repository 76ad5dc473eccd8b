"""The layer profiler on CPU: well-formed rows, activation bytes, TP under gloo, OOM skips."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

from api.cli import app  # noqa: E402
from planner import evaluate, parse_plan, parse_scenario  # noqa: E402
from profiles import layer_profiler  # noqa: E402
from profiles.estimate import activation_bytes  # noqa: E402
from profiles.layer_profiler import (  # noqa: E402
    ProfileOptions,
    profile_layers,
    saved_activation_bytes,
)
from profiles.models import PRESETS, layer_params  # noqa: E402
from profiles.rows import kinds_from_rows  # noqa: E402
from profiles.torch_layers import build_layer  # noqa: E402

CORE = ("gpu_type", "kind", "micro_batch", "tp", "forward_ms", "backward_ms", "activation_bytes")


@pytest.fixture(scope="module")
def tiny_rows() -> list[dict[str, Any]]:
    """tiny-gpt at micro-batches 1, 2 and TP 1, 2 (TP=2 in two gloo processes), the local head
    of schedule `local` included."""
    options = ProfileOptions(micro_batches=(1, 2), tp_sizes=(1, 2), warmup=1, repeats=3,
                             kinds=("embedding", "block", "head", "local_head"))
    profile = profile_layers(PRESETS["tiny-gpt"], options)
    assert profile.skipped == []
    return profile.rows("cpu")


def by_point(rows: list[dict[str, Any]]) -> dict[tuple[str, int, int], dict[str, Any]]:
    return {(r["kind"], r["micro_batch"], r["tp"]): r for r in rows}


def test_rows_cover_every_point_with_positive_times(tiny_rows: list[dict[str, Any]]) -> None:
    assert set(by_point(tiny_rows)) == {(k, b, t)
                                        for k in ("embedding", "block", "head", "local_head")
                                        for b in (1, 2) for t in (1, 2)}
    for row in tiny_rows:
        assert row["forward_ms"] > 0 and row["backward_ms"] > 0
        assert row["activation_bytes"] > 0
        assert row["x_source"] == "measured"
        assert row["x_timer"] == "perf_counter"
        assert row["x_forward_spread_ms"] >= 0
        assert isinstance(row["x_noisy"], bool)


def test_activation_bytes_grow_with_micro_batch_and_shrink_with_tp(
    tiny_rows: list[dict[str, Any]],
) -> None:
    rows = by_point(tiny_rows)
    for kind in ("embedding", "block", "head", "local_head"):
        for tp in (1, 2):
            assert rows[kind, 2, tp]["activation_bytes"] > rows[kind, 1, tp]["activation_bytes"]
    for b in (1, 2):
        assert rows["block", b, 2]["activation_bytes"] < rows["block", b, 1]["activation_bytes"]
        # Replicated layers keep the same activations under TP.
        for head in ("head", "local_head"):
            assert rows[head, b, 2]["activation_bytes"] == rows[head, b, 1]["activation_bytes"]


def test_measured_activations_equal_the_estimate_formula(tiny_rows: list[dict[str, Any]]) -> None:
    spec = PRESETS["tiny-gpt"]
    for row in tiny_rows:
        tp = row["tp"] if row["kind"] == "block" else 1
        expected = activation_bytes(spec, row["kind"], row["micro_batch"], tp, dtype_bytes=4)
        assert row["activation_bytes"] == expected, row


def test_params_and_output_sizes_come_from_the_modules(tiny_rows: list[dict[str, Any]]) -> None:
    spec = PRESETS["tiny-gpt"]
    rows = by_point(tiny_rows)
    assert rows["block", 1, 2]["x_local_params"] < rows["block", 1, 1]["x_local_params"]
    assert rows["block", 1, 1]["x_local_params"] == layer_params(spec, "block")
    assert kinds_from_rows(tiny_rows)["block"]["output_bytes_per_sample"] == \
        spec.seq_len * spec.hidden * 4
    assert kinds_from_rows(tiny_rows)["head"]["output_bytes_per_sample"] == 0
    local = kinds_from_rows(tiny_rows)["local_head"]
    assert local == {"params": layer_params(spec, "local_head"), "output_bytes_per_sample": 0}


def _local_scenario(rows: list[dict[str, Any]], *, global_batch_size: int) -> dict[str, Any]:
    """tiny-gpt on two CPU "GPUs" under schedule `local`, its profile rows `rows`."""
    spec = PRESETS["tiny-gpt"]
    return {
        "gpu_types": {"cpu": {"memory_gib": 4}},
        "cluster": {"nodes": [{"name": "host", "gpu_type": "cpu", "gpus": 2}],
                    "intra_node": {"cpu": {"bandwidth_gb_per_s": 2, "latency_us": 50}},
                    "inter_node": {"bandwidth_gb_per_s": 1, "latency_us": 100}},
        "model": {"name": spec.name, "seq_len": spec.seq_len,
                  "layers": ["embedding", "block", "block", "head"],
                  "kinds": kinds_from_rows(rows)},
        "profiles": rows,
        "job": {"global_batch_size": global_batch_size, "schedule": "local",
                "local_head_kind": "local_head"},
    }


def test_rows_make_a_scenario_the_planner_accepts(tiny_rows: list[dict[str, Any]]) -> None:
    document = _local_scenario(tiny_rows, global_batch_size=8)
    scenario = parse_scenario(document)
    assert len(scenario.profiles) == 16


def test_a_local_plan_is_estimated_from_the_measured_local_head_rows(
    tiny_rows: list[dict[str, Any]],
) -> None:
    """The rows of the head kind a local job names are what its stages' backwards add."""
    document = _local_scenario(tiny_rows, global_batch_size=4)
    plan = {"format": "hetplan-plan/1", "schedule": "local", "pipelines": [
        {"micro_batch_size": 2, "num_micro_batches": 2, "stages": [
            {"gpu_type": "cpu", "tp": 1, "gpus": ["host:0"], "layers": [0, 2]},
            {"gpu_type": "cpu", "tp": 1, "gpus": ["host:1"], "layers": [2, 4]}]}]}
    evaluation = evaluate(parse_scenario(document), parse_plan(plan))
    assert evaluation.valid, evaluation.errors
    first = evaluation.pipelines[0].stages[0]
    head = by_point(tiny_rows)["local_head", 2, 1]
    assert (first.head_forward_ms, first.head_backward_ms) == (head["forward_ms"],
                                                               head["backward_ms"])


def test_saved_activation_bytes_leave_out_parameters() -> None:
    layer = torch.nn.Linear(8, 16, bias=False)
    x = torch.randn(4, 8, requires_grad=True)
    _, saved = saved_activation_bytes(layer, (x,))
    assert saved == 4 * 8 * 4  # the input only; the weight is model state


def test_out_of_memory_point_is_skipped_with_a_message(monkeypatch: pytest.MonkeyPatch) -> None:
    real = layer_profiler._measure

    def measure(*args: Any, **kwargs: Any) -> Any:
        if kwargs["micro_batch"] == 2 and kwargs["kind"] == "block":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")
        return real(*args, **kwargs)

    monkeypatch.setattr(layer_profiler, "_measure", measure)
    options = ProfileOptions(micro_batches=(1, 2), kinds=("block",), warmup=0, repeats=1)
    profile = profile_layers(PRESETS["tiny-gpt"], options)
    assert [(p.kind, p.micro_batch) for p in profile.points] == [("block", 1)]
    (skipped,) = profile.skipped
    assert (skipped.kind, skipped.micro_batch, skipped.tp) == ("block", 2, 1)
    assert "out of memory" in skipped.reason and "8.00 GiB" in skipped.reason


def test_a_repeat_times_the_mean_of_its_back_to_back_passes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Skewed passes: a row estimates the mean pass, which a step sums, not a single pass's median."""
    calls: list[int] = []

    def time_step(self: Any, forward: Any, grad_out: Any) -> tuple[float, float]:
        calls.append(1)
        # Every 4th pass waits, as an all-reduce does when its peer was descheduled.
        return (5.0, 10.0) if len(calls) % 4 == 0 else (1.0, 2.0)

    monkeypatch.setattr(layer_profiler._CpuTimer, "time_step", time_step)
    options = ProfileOptions(micro_batches=(1,), kinds=("block",), warmup=2, repeats=5, passes=4)
    (row,) = profile_layers(PRESETS["tiny-gpt"], options).rows("cpu")
    assert len(calls) == 2 + 5 * 4
    # Each repeat of 4 holds one slow pass; the median of single passes would say 1.0 / 2.0.
    assert (row["forward_ms"], row["backward_ms"]) == (2.0, 4.0)
    assert (row["x_repeats"], row["x_passes"]) == (5, 4)
    assert row["x_forward_spread_ms"] == 0.0


def test_other_runtime_errors_are_not_swallowed(monkeypatch: pytest.MonkeyPatch) -> None:
    def measure(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(layer_profiler, "_measure", measure)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        profile_layers(PRESETS["tiny-gpt"], ProfileOptions(micro_batches=(1,)))


def test_options_reject_bad_values() -> None:
    with pytest.raises(ValueError, match="micro_batches"):
        ProfileOptions(micro_batches=(0,))
    with pytest.raises(ValueError, match="device"):
        ProfileOptions(micro_batches=(1,), device="tpu")
    with pytest.raises(ValueError, match="passes"):
        ProfileOptions(micro_batches=(1,), passes=0)


def test_build_layer_cast_to_bfloat16_runs() -> None:
    spec = PRESETS["tiny-llama"]
    block = build_layer(spec, "block", layer_index=1, dtype=torch.bfloat16)
    out = block(torch.randn(1, spec.seq_len, spec.hidden, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16


def test_profile_layers_command_writes_rows(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    result = CliRunner().invoke(app, ["profile", "layers", "--model", "tiny-llama",
                                      "--micro-batches", "1", "--tp", "1", "--repeats", "2",
                                      "--warmup", "0", "-o", str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())
    assert [r["kind"] for r in rows] == ["embedding", "block", "head"]
    assert all(set(CORE) <= set(r) for r in rows)


def test_profile_layers_command_rejects_bad_tp(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["profile", "layers", "--model", "tiny-gpt", "--tp", "3"])
    assert result.exit_code == 2
    assert "num_heads (4) is not divisible by tp=3" in result.output


def test_profile_layers_under_torchrun_joins_the_group(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    hetplan = Path(sys.executable).parent / "hetplan"
    if not hetplan.exists():
        pytest.skip(f"no hetplan script next to {sys.executable}")
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(hetplan),
         "profile", "layers", "--model", "tiny-gpt", "--tp", "2", "--micro-batches", "1",
         "--repeats", "2", "--warmup", "0", "-o", str(out)],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert [(r["kind"], r["tp"]) for r in rows] == [("embedding", 2), ("block", 2), ("head", 2)]
    assert rows[1]["x_local_params"] < rows[1]["x_params"]
