"""Run a plan on this machine: one spawned process per GPU of the plan, gloo on CPU."""

from __future__ import annotations

from typing import Any

from launcher.runtime import TrainConfig, WorkerResult, run_worker
from planner.documents import Plan, dump_document
from planner.export.ranks import build_rank_map
from profiles.distributed import spawn

__all__ = ["launch_plan"]


def launch_plan(plan: Plan, config: TrainConfig, *, timeout_s: float = 300.0
                ) -> list[WorkerResult]:
    """Train `plan` for `config.steps` steps in local processes; each rank's result, by rank.

    Every GPU of the plan becomes one CPU process, whatever its node: the point is that the
    plan's layout (stages, TP shards, schedule, sync groups) runs and trains correctly, not
    its speed."""
    world_size = build_rank_map(plan).world_size
    document: dict[str, Any] = dump_document(plan)
    return spawn(run_worker, world_size=world_size, device="cpu", args=(document, config),
                 timeout_s=timeout_s)
