"""The pipelining export runs for real: torchrun starts the processes with the commands of
the torchrun export, each runs torch.distributed.pipelining from the pipelining export
alone (launcher/pipelining.py), and one step matches one process on the whole batch:
1F1B on decreasing ranks, ScheduleInterleaved1F1B with two chunks per rank, and stages
that recompute their forward under torch.utils.checkpoint."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch.distributed import pipelining  # noqa: E402

from launcher.pipelining import build_stage_module  # noqa: E402
from launcher.reference import reference_weights  # noqa: E402
from planner import evaluate, parse_plan, parse_scenario  # noqa: E402
from planner.export import export_plan, expressible  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"
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


def _run_and_compare(document: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    """Runs the plan under torchrun and asserts every saved weight is within TOLERANCE of
    one process's step; the export, for the caller's own checks."""
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(document))
    _run_torchrun_export(plan_path, tmp_path)
    export = export_plan(parse_plan(document), "pipelining")
    expected, _ = reference_weights("tiny-gpt", export["global_batch_size"], lr=LR)
    initial, _ = reference_weights("tiny-gpt", export["global_batch_size"], lr=0.0)
    largest_step = largest_difference = 0.0
    trained: Counter[int] = Counter()
    for rank in range(export["world_size"]):
        weights = torch.load(tmp_path / f"rank{rank}.pt")
        assert weights, f"rank {rank} saved no parameters"
        for name, tensor in weights.items():
            layer, reference_name = _reference_name(export["layer_module_names"], name)
            trained[layer] += 1
            want = expected[layer][reference_name]
            largest_difference = max(largest_difference, (tensor - want).abs().max().item())
            largest_step = max(largest_step,
                               (want - initial[layer][reference_name]).abs().max().item())
    # Every layer trained by one stage per pipeline, and no rank trained another's layers.
    holders = Counter(layer for p in parse_plan(document).pipelines for s in p.stages
                      for start, end in s.ranges for layer in range(start, end))
    assert {layer: trained[layer] // len(expected[layer]) for layer in trained} == holders
    print(f"largest difference {largest_difference:.2e}, largest step {largest_step:.2e}")
    assert largest_difference < TOLERANCE
    assert largest_step > 1000 * TOLERANCE  # the step moved the weights: the test can fail
    return export


def test_pipeline_on_decreasing_ranks_trains_like_one_process(tmp_path: Path) -> None:
    export = _run_and_compare(DECREASING, tmp_path)
    assert export["pipelines"][0]["pp_groups"] == [[1, 0]]


def _fixture(name: str) -> dict[str, Any]:
    """A hand-made plan of tests/launcher/data for tiny-gpt, valid for the estimator on
    tiny-scenario.json (4 CPU 'GPUs' of node n)."""
    document: dict[str, Any] = json.loads((DATA / f"{name}.plan.json").read_text())
    scenario = parse_scenario(json.loads((DATA / "tiny-scenario.json").read_text()))
    judged = evaluate(scenario, parse_plan(document))
    assert judged.valid, judged.errors
    return document


@pytest.mark.slow  # torchrun, 2-4 processes: about 10 s on 2 cores
def test_interleaved_pipeline_with_two_chunks_per_rank_trains_like_one_process(
        tmp_path: Path) -> None:
    export = _run_and_compare(_fixture("tiny-interleaved"), tmp_path)
    (pipeline,) = export["pipelines"]
    assert pipeline["schedule_class"] == "ScheduleInterleaved1F1B"
    assert [[c["stage_index"] for c in s["chunks"]] for s in pipeline["stages"]] == [[0, 2],
                                                                                  [1, 3]]


@pytest.mark.slow  # torchrun, 2-4 processes: about 10 s on 2 cores
def test_recomputing_stages_train_like_one_process(tmp_path: Path) -> None:
    # Pipeline 0 interleaved, its stage 1 recomputing; pipeline 1 one range per stage
    # (Schedule1F1B), its stage 0 recomputing.
    export = _run_and_compare(_fixture("tiny-interleaved-recompute"), tmp_path)
    assert [[s["recompute"] for s in p["stages"]] for p in export["pipelines"]] == [
        [False, True], [True, False]]
    assert [p["schedule_class"] for p in export["pipelines"]] == [
        "ScheduleInterleaved1F1B", "Schedule1F1B"]


class _StageStub(pipelining.stage._PipelineStageBase):  # type: ignore[misc]
    """What torch's schedule constructors read of a stage, without a process group."""


_StageStub.__abstractmethods__ = frozenset()


def _stub_stages(num_stages: int, chunks: int) -> list[_StageStub]:
    stages = []
    for j in range(chunks):
        stage = object.__new__(_StageStub)
        index = j * num_stages  # rank 0's chunks; the constructor lays out every rank
        stage.__dict__.update(group_size=num_stages, group_rank=0,
                              num_stages=num_stages * chunks, stage_index=index,
                              is_first=index == 0, is_last=index == num_stages * chunks - 1)
        stages.append(stage)
    return stages


def _torch_refuses(schedule_class: str, num_stages: int, chunks: int, m: int) -> bool:
    stages = _stub_stages(num_stages, chunks)
    try:
        getattr(pipelining, schedule_class)(stages if chunks > 1 else stages[0],
                                            n_microbatches=m)
    except ValueError:
        return True
    return False


def _grid_plan(num_stages: int, chunks: int, m: int) -> dict[str, Any]:
    num_layers = num_stages * chunks
    return {"schedule": "interleaved-1f1b" if chunks > 1 else "1f1b", "pipelines": [
        {"micro_batch_size": 1, "num_micro_batches": m, "stages": [
            {"gpu_type": "g", "tp": 1, "gpus": [f"a:{s}"],
             **({"chunks": [[c, c + 1] for c in range(s, num_layers, num_stages)]} if chunks > 1
                else {"layers": [s, s + 1]})}
            for s in range(num_stages)]}]}


@pytest.mark.parametrize(("num_stages", "chunks"), [(2, 1), (4, 1), (2, 2), (3, 2), (4, 3)])
def test_export_refuses_exactly_the_micro_batch_counts_torch_refuses(num_stages: int,
                                                                      chunks: int) -> None:
    for m in range(1, 3 * num_stages + 2):
        plan = parse_plan(_grid_plan(num_stages, chunks, m))
        refusal = expressible(plan, "pipelining")
        schedule_class = "ScheduleInterleaved1F1B" if chunks > 1 else "Schedule1F1B"
        assert (refusal is not None) == _torch_refuses(schedule_class, num_stages, chunks, m), (
            num_stages, chunks, m, refusal)


@pytest.mark.parametrize("recompute", [False, True])
def test_recompute_runs_the_stage_forward_again_in_the_backward(recompute: bool) -> None:
    names = export_plan(parse_plan(DECREASING), "pipelining")["layer_module_names"]
    module = build_stage_module("tiny-gpt", (0, 3), names, seed=0, recompute=recompute)
    calls = []
    module.layers["0"].register_forward_hook(lambda *_: calls.append(1))
    tokens = torch.zeros(2, 32, dtype=torch.long)
    module(tokens).sum().backward()
    assert len(calls) == (2 if recompute else 1)
