"""The pipelining export runs for real: torchrun starts the processes with the commands of
the torchrun export, each runs torch.distributed.pipelining from the pipelining export
alone (launcher/pipelining.py), and one step matches one process on the whole batch."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from launcher.reference import reference_weights  # noqa: E402
from planner import parse_plan  # noqa: E402
from planner.export import export_plan  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-6  # fp32, micro-batch sums in another order (observed ~1e-8)
LR = 0.1

# tiny-gpt (embedding, 2 blocks, head) on 4 processes of one node. Both pipelines put stage 0
# on a higher rank than stage 1 (ranks 1 -> 0 and 3 -> 2): a group built with sorted ranks
# would make stage 0 its own next stage. The splits differ (1 | 3 and 3 | 1) and so do the
# micro-batches (2 x 2 and 1 x 2), so every gradient-sync group pairs different stages and
# the batch shares are 2/3 and 1/3.
DECREASING = {
    "format": "hetplan-plan/1",
    "schedule": "1f1b",
    "pipelines": [
        {"micro_batch_size": 2, "num_micro_batches": 2, "stages": [
            {"gpu_type": "cpu", "tp": 1, "gpus": ["a:1"], "layers": [0, 1]},
            {"gpu_type": "cpu", "tp": 1, "gpus": ["a:0"], "layers": [1, 4]}]},
        {"micro_batch_size": 1, "num_micro_batches": 2, "stages": [
            {"gpu_type": "cpu", "tp": 1, "gpus": ["a:3"], "layers": [0, 3]},
            {"gpu_type": "cpu", "tp": 1, "gpus": ["a:2"], "layers": [3, 4]}]},
    ],
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run_torchrun_export(plan_path: Path, out: Path) -> None:
    """Every node command of the torchrun export, torchrun run as `python -m
    torch.distributed.run` so the test needs no console script on PATH."""
    torchrun = export_plan(parse_plan(json.loads(plan_path.read_text())), "torchrun",
                           master_addr="127.0.0.1", master_port=_free_port(),
                           training_module="launcher.pipelining", plan_path=str(plan_path),
                           script_args=["--out", str(out), "--lr", str(LR)])
    (node,) = torchrun["nodes"]
    argv = [sys.executable, "-m", "torch.distributed.run", *node["argv"][1:]]
    done = subprocess.run(argv, cwd=REPO, env={**os.environ, **node["env"]},
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]


def _reference_name(module_names: list[list[str]], name: str) -> tuple[int, str]:
    """(layer, parameter name in profiles.torch_layers) of a stage parameter's name."""
    for layer, names in enumerate(module_names):
        for module in names:
            if name.startswith(f"{module}."):
                rest = name.removeprefix(f"{module}.")
                return layer, {"norm": f"norm.{rest}", "lm_head": rest}.get(module, rest)
    raise KeyError(name)


def test_pipeline_on_decreasing_ranks_trains_like_one_process(tmp_path: Path) -> None:
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(DECREASING))
    _run_torchrun_export(plan_path, tmp_path)
    export = export_plan(parse_plan(DECREASING), "pipelining")
    assert export["pipelines"][0]["pp_groups"] == [[1, 0]]
    expected, _ = reference_weights("tiny-gpt", export["global_batch_size"], lr=LR)
    initial, _ = reference_weights("tiny-gpt", export["global_batch_size"], lr=0.0)
    largest_step = largest_difference = 0.0
    for rank in range(export["world_size"]):
        weights = torch.load(tmp_path / f"rank{rank}.pt")
        assert weights, f"rank {rank} saved no parameters"
        for name, tensor in weights.items():
            layer, reference_name = _reference_name(export["layer_module_names"], name)
            want = expected[layer][reference_name]
            largest_difference = max(largest_difference, (tensor - want).abs().max().item())
            largest_step = max(largest_step,
                               (want - initial[layer][reference_name]).abs().max().item())
    assert largest_difference < TOLERANCE
    assert largest_step > 1000 * TOLERANCE  # the step moved the weights: the test can fail
