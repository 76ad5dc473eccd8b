"""The reference launcher: runs a hetplan plan for real with torch.distributed.

Only this package imports torch; the planner and its exports stay pure.

    launch_plan(plan, TrainConfig(...))  spawn one process per GPU of the plan (CPU, gloo)
    python -m launcher.train --plan P    the same worker under torchrun
    reference_weights(...)               the single-process run a plan must reproduce
"""

from launcher.launch import launch_plan
from launcher.reference import reference_weights
from launcher.runtime import TrainConfig, WorkerResult, run_worker

__all__ = ["TrainConfig", "WorkerResult", "launch_plan", "reference_weights", "run_worker"]
