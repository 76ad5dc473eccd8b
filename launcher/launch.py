"""Run a plan on this machine: one spawned process per GPU of the plan, gloo on CPU."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from launcher.layout import launch_rank_map
from launcher.runtime import TrainConfig, WorkerResult, check_plan, run_worker
from planner.documents import Plan, dump_document
from profiles.distributed import spawn
from profiles.models import get_preset

__all__ = ["launch_plan", "check_launchable", "StepReport"]


@dataclass(frozen=True, kw_only=True)
class StepReport:
    """One training step as rank 0 saw it: the loss over the global batch, the slowest
    rank's wall time."""

    step: int
    loss: float
    step_s: float


def check_launchable(plan: Plan, config: TrainConfig) -> None:
    """`ValueError` saying what to change when the workers could not run the plan: an unknown
    model preset, a plan that splits another number of layers, or a layout its schedule cannot
    run (`launcher.layout.launch_problems`)."""
    try:
        get_preset(config.model)
    except KeyError as error:
        raise ValueError(str(error).strip("'\"")) from None
    check_plan(plan, config)


def launch_plan(plan: Plan, config: TrainConfig, *, timeout_s: float = 300.0,
                on_step: Callable[[StepReport], None] | None = None) -> list[WorkerResult]:
    """Train `plan` for `config.steps` steps in local processes; each rank's result, by rank.

    Every GPU of the plan becomes one CPU process, whatever its node: the point is that the
    plan's layout (stages, TP shards, schedule, sync groups) runs and trains correctly, not
    its speed. The plan is checked (`check_launchable`) before any process starts;
    `on_step` hears of each step as it ends."""
    check_launchable(plan, config)
    world_size = launch_rank_map(plan).world_size
    document: dict[str, Any] = dump_document(plan)

    def forward(line: str) -> None:
        if on_step is not None:
            on_step(StepReport(**json.loads(line)))

    return spawn(run_worker, world_size=world_size, device="cpu", args=(document, config),
                 timeout_s=timeout_s, on_progress=forward)
