"""The reference launcher: runs a hetplan plan for real with torch.distributed.

Only this package imports torch; the planner and its exports stay pure.

    launch_plan(plan, TrainConfig(...))  spawn one process per GPU of the plan (CPU, gloo)
    python -m launcher.train --plan P    the same worker under torchrun
    reference_weights(...)               the single-process run a plan must reproduce
    local_reference_weights(...)         the same for local learning (schedule local)

Schedules: 1f1b, gpipe, interleaved-1f1b (stage chunks), local; any stage may recompute.
"""

from launcher.launch import launch_plan
from launcher.reference import local_reference_weights, reference_weights
from launcher.runtime import TrainConfig, WorkerResult, run_worker

__all__ = ["TrainConfig", "WorkerResult", "launch_plan", "local_reference_weights",
           "reference_weights", "run_worker"]
