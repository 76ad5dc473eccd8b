"""Compare a launched plan's weights with the single-process run on the same data."""

from __future__ import annotations

from collections.abc import Sequence

from launcher.reference import reference_weights
from launcher.runtime import TrainConfig, WorkerResult
from planner.documents import Plan
from planner.export.ranks import build_rank_map
from profiles.torch_layers import shard_tensor

__all__ = ["weight_differences", "max_weight_difference"]


def weight_differences(plan: Plan, config: TrainConfig, results: Sequence[WorkerResult]
                       ) -> dict[tuple[int, int, str], float]:
    """Largest absolute difference per (rank, layer, parameter) between each rank's tensor
    and its shard of the single-process weights; needs `config.return_weights`."""
    if not config.return_weights:
        raise ValueError("results carry no weights; launch with TrainConfig(return_weights=True)")
    ranks = build_rank_map(plan)
    expected, _ = reference_weights(config.model, ranks.global_batch_size, seed=config.seed,
                                    steps=config.steps, optimizer=config.optimizer, lr=config.lr)
    differences = {}
    for result in results:
        tp_size = ranks.ranks[result.rank].tp_size
        for index, params in result.weights.items():
            for name, tensor in params.items():
                shard = shard_tensor(name, expected[index][name], tp_rank=result.tp_rank,
                                     tp_size=tp_size)
                differences[result.rank, index, name] = float((tensor - shard).abs().max())
    return differences


def max_weight_difference(plan: Plan, config: TrainConfig, results: Sequence[WorkerResult]
                          ) -> float:
    return max(weight_differences(plan, config, results).values())
