"""A launched heterogeneous plan trains exactly like one process on the whole batch.

Each test spawns one CPU process per GPU of a plan (gloo), runs real steps of
tiny-gpt (embedding, 2 blocks, head), and compares every rank's weights with
its shard of a single-process run on the same seed and data, optimised by
torch.optim (the launcher uses its own SGD/Adam, so the optimizers are checked
too).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from launcher import TrainConfig, launch_plan  # noqa: E402
from launcher.check import weight_differences  # noqa: E402
from launcher.optim import Adam, Sgd  # noqa: E402
from launcher.reference import reference_weights  # noqa: E402
from planner import parse_plan  # noqa: E402
from planner.export import rank_map  # noqa: E402
from profiles.torch_layers import build_layer, get_preset, layer_kinds  # noqa: E402

# fp32: the plan sums the same terms in another order (micro-batches, TP partial sums).
TOLERANCE = 1e-6

# Two asymmetric pipelines, 4 processes, 1F1B: pipeline 0 has two stages, the second TP=2
# (its GPUs listed out of index order, so TP rank 0 is not local rank 0) with micro-batches
# of 2; pipeline 1 holds the whole model on one GPU with micro-batches of 1. The TP stage
# receives activations and sends gradients back. Layers [0, 2) sync shard to shard, [2, 4)
# across TP degrees 2 and 1 (full-size reduce).
TP_LAST_1F1B = {
    "format": "hetplan-plan/1",
    "schedule": "1f1b",
    "pipelines": [
        {"micro_batch_size": 2, "num_micro_batches": 3, "stages": [
            {"gpu_type": "cpu", "tp": 1, "gpus": ["n0:0"], "layers": [0, 2]},
            {"gpu_type": "cpu", "tp": 2, "gpus": ["n0:2", "n0:1"], "layers": [2, 4]}]},
        {"micro_batch_size": 1, "num_micro_batches": 2, "stages": [
            {"gpu_type": "cpu", "tp": 1, "gpus": ["n1:0"], "layers": [0, 4]}]},
    ],
}

# 4 processes, GPipe: a TP=2 first stage that sends activations and receives gradients;
# split points 3 | 1 against a single stage; micro-batch sizes 1 and 2.
TP_FIRST_GPIPE = {
    "format": "hetplan-plan/1",
    "schedule": "gpipe",
    "pipelines": [
        {"micro_batch_size": 1, "num_micro_batches": 4, "stages": [
            {"gpu_type": "cpu", "tp": 2, "gpus": ["n0:0", "n0:1"], "layers": [0, 3]},
            {"gpu_type": "cpu", "tp": 1, "gpus": ["n0:2"], "layers": [3, 4]}]},
        {"micro_batch_size": 2, "num_micro_batches": 1, "stages": [
            {"gpu_type": "cpu", "tp": 1, "gpus": ["n1:0"], "layers": [0, 4]}]},
    ],
}


def _initial_weights() -> dict[int, dict[str, torch.Tensor]]:
    spec = get_preset("tiny-gpt")
    return {i: {n: p.detach().clone()
                for n, p in build_layer(spec, kind, layer_index=i).named_parameters()}
            for i, kind in enumerate(layer_kinds(spec))}


def test_one_step_of_asymmetric_pipelines_with_a_tp_last_stage_equals_single_process() -> None:
    plan = parse_plan(TP_LAST_1F1B)
    groups = rank_map(plan)["sync_groups"]
    assert [g["kind"] for g in groups] == ["sharded", "resharded"]  # both sync paths run
    config = TrainConfig(model="tiny-gpt", steps=1, seed=3, optimizer="sgd", lr=0.5,
                         return_weights=True)
    results = launch_plan(plan, config, timeout_s=120)

    differences = weight_differences(plan, config, results)
    # Every parameter of every layer was checked on every rank that holds it.
    assert len(differences) == sum(len(r.weights[i]) for r in results for i in r.weights)
    worst = max(differences, key=differences.__getitem__)
    assert differences[worst] < TOLERANCE, f"rank/layer/param {worst}: {differences[worst]}"

    # The step moved the weights far beyond the tolerance, so equality is not trivial.
    initial = _initial_weights()
    single_process = results[3]  # pipeline 1 holds every layer unsharded
    moved = max(float((single_process.weights[i][n] - initial[i][n]).abs().max())
                for i in initial for n in initial[i])
    assert moved > 1000 * TOLERANCE

    _, losses = reference_weights("tiny-gpt", 8, seed=3, steps=1, optimizer="sgd", lr=0.5)
    assert all(r.losses == pytest.approx(losses, abs=1e-6) for r in results)


def test_two_steps_of_gpipe_with_a_tp_first_stage_equal_single_process() -> None:
    # SGD, not Adam: Adam's first step moves each weight by about lr * g / (|g| + eps), so a
    # gradient of 4e-9 that fp32 rounding makes 4.7e-9 (a 6e-10 difference, well inside
    # tolerance) moves its weight by about 3% of lr differently (2.75e-5 at lr 1e-3).
    # test_adam_matches_torch_adam checks the Adam update itself.
    plan = parse_plan(TP_FIRST_GPIPE)
    config = TrainConfig(model="tiny-gpt", steps=2, seed=1, optimizer="sgd", lr=0.5,
                         return_weights=True)
    results = launch_plan(plan, config, timeout_s=120)
    differences = weight_differences(plan, config, results)
    worst = max(differences, key=differences.__getitem__)
    assert differences[worst] < TOLERANCE, f"rank/layer/param {worst}: {differences[worst]}"
    assert len(results[0].step_s) == 2 and all(t > 0 for t in results[0].step_s)
    assert results[0].losses[0] != results[0].losses[1]  # two different batches


def test_adam_matches_torch_adam() -> None:
    generator = torch.Generator().manual_seed(0)
    ours = torch.nn.Parameter(torch.randn(64, generator=generator))
    theirs = torch.nn.Parameter(ours.detach().clone())
    adam, reference = Adam([ours], lr=1e-2), torch.optim.Adam([theirs], lr=1e-2)
    for step in range(4):
        gradient = torch.randn(64, generator=generator) * 10.0 ** -step
        ours.grad, theirs.grad = gradient.clone(), gradient.clone()
        adam.step()
        reference.step()
    assert float((ours.detach() - theirs.detach()).abs().max()) < 1e-7


def test_sgd_matches_torch_sgd() -> None:
    generator = torch.Generator().manual_seed(0)
    ours = torch.nn.Parameter(torch.randn(64, generator=generator))
    theirs = torch.nn.Parameter(ours.detach().clone())
    sgd, reference = Sgd([ours], lr=0.3), torch.optim.SGD([theirs], lr=0.3)
    for _ in range(3):
        gradient = torch.randn(64, generator=generator)
        ours.grad, theirs.grad = gradient.clone(), gradient.clone()
        sgd.step()
        reference.step()
    assert float((ours.detach() - theirs.detach()).abs().max()) < 1e-7
