"""Plans written for torch.distributed.pipelining: per pipeline a schedule class, its
stages (one PipelineStage per chunk under interleaving) and groups, and the gradient sync
across pipelines, which pipelining leaves to the caller. `launcher/pipelining.py` runs
this export as it stands.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from planner.documents import Plan, Schedule, Stage
from planner.errors import UnsupportedExport
from planner.export.formats import (
    LOCAL_REASON,
    _kinds,
    _schedule,
    _schedule_notes,
    _torchtitan_names,
)
from planner.export.ranks import build_rank_map
from planner.schedules import model_chunks

__all__ = ["INTERLEAVED_CLASS", "PIPELINING_SCHEDULES", "PP_GROUP_OPTIONS", "export_pipelining"]

# torch.distributed.pipelining's class for each plan schedule; a pipeline of several chunks
# per stage runs INTERLEAVED_CLASS (one chunk per stage runs 1F1B, as the estimator has it).
PIPELINING_SCHEDULES = {Schedule.ONE_F_ONE_B: "Schedule1F1B", Schedule.GPIPE: "ScheduleGPipe",
                        Schedule.INTERLEAVED_1F1B: "Schedule1F1B"}
INTERLEAVED_CLASS = "ScheduleInterleaved1F1B"
# Keyword arguments of dist.new_group for a pipeline's group. new_group sorts its ranks by
# default, and a PipelineStage maps stage i to group rank i, so a pipeline whose stages sit
# on decreasing ranks would send stage 0's activations to itself (torch 2.13, tested, has it).
PP_GROUP_OPTIONS = {"sort_ranks": False}
RECOMPUTE_NOTE = ("Stages with recompute: true keep only each micro-batch's input: run each of "
                  "their chunk modules as torch.utils.checkpoint.checkpoint(module, x, "
                  "use_reentrant=False), which runs the forward again in the backward.")


def _pipelining_reasons(plan: Plan, schedule: Schedule) -> list[str]:
    """What torch.distributed.pipelining (torch 2.13, read from its schedules) refuses."""
    reasons = [] if schedule is not Schedule.LOCAL else [LOCAL_REASON]
    for p, pipeline in enumerate(plan.pipelines):
        tps = [s.tp for s in pipeline.stages]
        if len(set(tps)) > 1:
            reasons.append(f"pipelines[{p}] mixes TP degrees {tps}; a PipelineStage group links "
                           "one rank per stage, so every stage of a pipeline needs the same TP "
                           "degree")
        num_stages, m = len(pipeline.stages), pipeline.num_micro_batches
        schedule_class = _pipelining_class(schedule, pipeline.stages[0].num_chunks)
        rounds = max(1, m // num_stages)
        if schedule_class == "Schedule1F1B" and m < num_stages:
            reasons.append(f"pipelines[{p}]: {m} micro-batches on {num_stages} stages; torch's "
                           "Schedule1F1B needs n_microbatches >= the number of stages")
        if schedule_class == INTERLEAVED_CLASS and m % rounds:
            reasons.append(f"pipelines[{p}]: {m} micro-batches on {num_stages} stages; torch's "
                           f"ScheduleInterleaved1F1B runs max(1, {m} // {num_stages}) = {rounds} "
                           "rounds and needs n_microbatches to be a multiple of that")
    return reasons


def _pipelining_class(schedule: Schedule, chunks_per_stage: int) -> str:
    """torch's class for a pipeline: one chunk per stage runs the plain 1F1B order even in
    an interleaved plan, as the estimator times it."""
    if schedule is Schedule.INTERLEAVED_1F1B and chunks_per_stage > 1:
        return INTERLEAVED_CLASS
    return PIPELINING_SCHEDULES.get(schedule, "Schedule1F1B")


def _pipelining_stage(s: int, stage: Stage, num_stages: int, ranks: tuple[int, ...],
                      kinds: Sequence[str]) -> dict[str, Any]:
    """A stage entry. Like the plan, a stage of one range has `layers` (one PipelineStage of
    index s), a stage of several has `chunks`: one PipelineStage each, in the order torch's
    interleaved schedule takes a rank's stages (chunk j is torch's stage j * S + s)."""
    chunks = [{"stage_index": j * num_stages + s, "layers": list(layers),
               "module_names": _torchtitan_names(kinds, layers)}
              for j, layers in enumerate(stage.ranges)]
    layers = ({"layers": chunks[0]["layers"], "module_names": chunks[0]["module_names"]}
              if len(chunks) == 1 else {"chunks": chunks})
    return {"stage_index": s, **layers, "recompute": stage.recompute, "tp_size": stage.tp,
            "ranks": list(ranks), "gpu_type": stage.gpu_type}


def _flex_order_notes(plan: Plan) -> list[str]:
    return [f"pipelines[{p}]: {pipeline.num_micro_batches} micro-batches are not a multiple of "
            f"its {len(pipeline.stages)} stages: torch runs its own interleaved order, not the "
            "one the plan was estimated on (the cost model's interleaved-1f1b needs a multiple)."
            for p, pipeline in enumerate(plan.pipelines)
            if pipeline.stages[0].num_chunks > 1
            and pipeline.num_micro_batches % len(pipeline.stages)]


def export_pipelining(plan: Plan, *, layer_kinds: Sequence[str] | None = None,
                      job_schedule: str | None = None) -> dict[str, Any]:
    """Per pipeline: a schedule class, its stages' chunks (layer ranges, module names and
    torch stage indices) and the process groups; the gradient sync across pipelines is left
    to the caller (pipelining has no data parallelism of its own), given here as the rank
    map's sync groups."""
    ranks = build_rank_map(plan)
    kinds = _kinds(ranks.num_layers, layer_kinds)
    schedule = _schedule(plan, job_schedule)
    reasons = _pipelining_reasons(plan, schedule)
    if reasons:
        raise UnsupportedExport("pipelining", reasons)
    layer_modules = [_torchtitan_names(kinds, (layer, layer + 1))
                     for layer in range(ranks.num_layers)]
    pipelines = []
    for p, pipeline in enumerate(plan.pipelines):
        num_stages, v = len(pipeline.stages), pipeline.stages[0].num_chunks
        stage_ranks = [ranks.stage_ranks(p, s) for s in range(num_stages)]
        share = ranks.pipelines[p]
        pipelines.append({
            "pipeline": p,
            "schedule_class": _pipelining_class(schedule, v),
            "n_microbatches": pipeline.num_micro_batches,
            "micro_batch_size": pipeline.micro_batch_size,
            "first_sample": share.first_sample,
            "num_samples": share.num_samples,
            "batch_share": share.batch_share,
            "num_stages": num_stages,
            "chunks_per_stage": v,
            "num_model_chunks": num_stages * v,
            "split_points": [start for start, _ in model_chunks(pipeline)[1:]],
            # One PipelineStage group per TP rank: stage s's k-th GPU talks to stage s+1's k-th.
            # Ranks in stage order, which need not be increasing: see PP_GROUP_OPTIONS.
            "pp_groups": [list(group) for group in zip(*stage_ranks, strict=True)],
            "stages": [_pipelining_stage(s, stage, num_stages, stage_ranks[s], kinds)
                       for s, stage in enumerate(pipeline.stages)],
        })
    return {
        "format": "pipelining",
        "schedule": schedule.value,
        "world_size": ranks.world_size,
        "global_batch_size": ranks.global_batch_size,
        "pp_group_options": dict(PP_GROUP_OPTIONS),
        "layer_module_names": layer_modules,
        "pipelines": pipelines,
        "gradient_sync": [
            {"layers": list(g.layers), "kind": g.kind,
             "module_names": [name for layer in range(*g.layers) for name in layer_modules[layer]],
             "rank_groups": [list(group) for group in g.rank_groups]}
            for g in ranks.sync_groups
        ],
        "notes": [
            *_schedule_notes(plan, job_schedule),
            "Every process creates every pp group, in the order given, with "
            "dist.new_group(ranks, **pp_group_options): sort_ranks=False keeps the stage order, "
            "since a PipelineStage takes the process of group rank i to be stage i.",
            "Build each pipeline's stages with PipelineStage(submodule, stage_index, "
            "num_model_chunks, device, group=<its pp group>) and run schedule_class(stage, "
            "n_microbatches, loss_fn).step(...) on it with the samples [first_sample, "
            "first_sample + num_samples) of the global batch. A stage with chunks builds one "
            "PipelineStage per chunk (its stage_index) and gives ScheduleInterleaved1F1B the "
            "list of them, in the listed order.",
            *([RECOMPUTE_NOTE] if any(s.recompute for p in plan.pipelines for s in p.stages)
              else []),
            *_flex_order_notes(plan),
            "The schedules average gradients over micro-batches (scale_grads=True); multiply a "
            "pipeline's gradients by its batch_share, then all-reduce (sum) the gradients of "
            "each gradient_sync entry's module_names over its rank_groups before the "
            "optimizer step.",
        ],
    }
