"""Compare a launched plan's weights with the single-process run on the same data: end-to-end
training for every schedule but `local`, local learning on the plan's blocks for `local`."""

from __future__ import annotations

from collections.abc import Sequence

from launcher.layout import launch_rank_map
from launcher.reference import local_reference_weights, reference_weights
from launcher.runtime import TrainConfig, WorkerResult, resolve_schedule
from planner.documents import Plan, Schedule
from profiles.torch_layers import shard_tensor

__all__ = ["weight_differences", "max_weight_difference", "LOCAL_HEAD_PREFIX"]

LOCAL_HEAD_PREFIX = "local_head."
"""Parameters of a block's local head are reported under its block's last layer, so named."""


def weight_differences(plan: Plan, config: TrainConfig, results: Sequence[WorkerResult]
                       ) -> dict[tuple[int, int, str], float]:
    """Largest absolute difference per (rank, layer, parameter) between each rank's tensor
    and its shard of the single-process weights; needs `config.return_weights`."""
    if not config.return_weights:
        raise ValueError("results carry no weights; launch with TrainConfig(return_weights=True)")
    ranks = launch_rank_map(plan)
    local = resolve_schedule(plan.schedule, config.schedule) is Schedule.LOCAL
    if local:
        blocks = [stage.layers for stage in plan.pipelines[0].stages]
        reference = local_reference_weights(
            config.model, ranks.global_batch_size, blocks, seed=config.seed, steps=config.steps,
            optimizer=config.optimizer, lr=config.lr)
        expected, heads = reference.weights, reference.heads
    else:
        expected, _ = reference_weights(config.model, ranks.global_batch_size, seed=config.seed,
                                        steps=config.steps, optimizer=config.optimizer,
                                        lr=config.lr)
        blocks, heads = [], {}
    differences = {}
    for result in results:
        tp_size = ranks.ranks[result.rank].tp_size
        for index, params in result.weights.items():
            for name, tensor in params.items():
                shard = shard_tensor(name, expected[index][name], tp_rank=result.tp_rank,
                                     tp_size=tp_size)
                differences[result.rank, index, name] = float((tensor - shard).abs().max())
        for name, tensor in result.local_head.items():
            last_layer = blocks[result.stage][1] - 1
            differences[result.rank, last_layer, LOCAL_HEAD_PREFIX + name] = float(
                (tensor - heads[result.stage][name]).abs().max())
    return differences


def max_weight_difference(plan: Plan, config: TrainConfig, results: Sequence[WorkerResult]
                          ) -> float:
    return max(weight_differences(plan, config, results).values())
