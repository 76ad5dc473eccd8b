"""Why a scenario has no plan at all, told with the numbers."""

from __future__ import annotations

from planner.costs import GIB
from planner.search.tables import ScenarioTables

__all__ = ["infeasibility_reason", "no_plan_reason"]


def infeasibility_reason(tables: ScenarioTables) -> str | None:
    """None when some pipeline may fit; else what the smallest stage needs versus the GPUs."""
    if not tables.points:
        kinds = sorted(set(tables.scenario.model.layers))
        return (f"no GPU type in the cluster has a profiled (micro_batch, tp) point covering "
                f"every layer kind {kinds}; upload profiles for them")
    need_best: float | None = None
    for (gpu_type, b, tp), point in tables.points.items():
        # The least a stage can hold is one layer with one micro-batch in flight.
        for layer in range(tables.num_layers):
            state = tables.state_bytes(layer, layer + 1, tp, 1)
            acts = float(point.activation_bytes[layer + 1] - point.activation_bytes[layer])
            if state + acts > tables.capacity_bytes[gpu_type]:
                break
        else:
            return None
        need = _largest_single_layer(tables, gpu_type, b, tp)
        need_best = need if need_best is None else min(need_best, need)
    largest = max(tables.scenario.gpu_types[c.gpu_type].memory_gib for c in tables.classes)
    assert need_best is not None
    return (f"nothing fits in memory: the smallest stage that fits needs {need_best / GIB:.2f} "
            f"GiB per GPU (one layer, one micro-batch in flight, reserved memory included), "
            f"but the largest GPU has {largest:g} GiB; add GPUs with more memory, profile "
            f"higher tp or smaller micro-batches, or use ZeRO (job.zero_stage)")


def _largest_single_layer(tables: ScenarioTables, gpu_type: str, b: int, tp: int) -> float:
    point = tables.points[(gpu_type, b, tp)]
    reserved = tables.scenario.reserved_gib(gpu_type) * GIB
    return max(
        tables.state_bytes(layer, layer + 1, tp, 1)
        + float(point.activation_bytes[layer + 1] - point.activation_bytes[layer]) + reserved
        for layer in range(tables.num_layers)
    )


def no_plan_reason(tables: ScenarioTables) -> str:
    """Why the search found no valid plan although single layers fit somewhere."""
    state = tables.state_bytes(0, tables.num_layers, 1, 1)
    room = sum(tables.capacity_bytes[c.gpu_type] * c.num_gpus for c in tables.classes)
    if state > room:
        return (f"nothing fits in memory: the model's weights, gradients and optimizer state "
                f"need {state / GIB:.2f} GiB but all GPUs together have {room / GIB:.2f} GiB "
                f"after reserved memory; add GPUs or use ZeRO (job.zero_stage)")
    return (f"no valid plan: every arrangement tried breaks a memory limit once activations "
            f"are counted (the model's state alone needs {state / GIB:.2f} GiB of the "
            f"{room / GIB:.2f} GiB free across all GPUs, and pipelines hold activations of "
            f"several micro-batches); add GPUs or memory, profile smaller micro-batches or "
            f"higher tp, or use ZeRO (job.zero_stage)")
