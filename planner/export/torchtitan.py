"""Plans written for torchtitan: its parallelism and training settings, as command-line
flags (torchtitan 0.3, whose configs are Python functions) and as a TOML file (the
releases before, which read `--job.config_file`).

torchtitan builds one device mesh `pp, dp_replicate, dp_shard, cp, tp` (slowest first),
so it runs plans whose pipelines are identical replicas on one grid, numbered tp fastest,
then data parallel, then pipeline stage. Stage bounds go in
`parallelism.module_fqns_per_model_part`, so any contiguous split, uneven or with a stage
holding only the embedding, is expressible; with several chunks per stage it lists every
model chunk in model order, which torchtitan's looped stage numbering (rank r holds parts
r, r + PP, ...) assigns as the plan does, under its Interleaved1F1B schedule.

Activation checkpointing is always set: torchtitan's default (selective) would recompute
where the plan does not.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from planner.documents import Plan, Schedule
from planner.errors import UnsupportedExport
from planner.export.formats import (
    LM_HEAD,
    LM_HEAD_BEFORE_0_3,
    TP_DP_PP,
    _chunks_per_stage,
    _effective_schedule,
    _grid_placement,
    _kind_reasons,
    _kinds,
    _recompute_all,
    _schedule,
    _schedule_notes,
    _torchtitan_names,
    _uniform_reasons,
)
from planner.export.ranks import build_rank_map
from planner.schedules import model_chunks

__all__ = ["TORCHTITAN_SCHEDULES", "export_torchtitan"]

# parallelism.pipeline_parallel_schedule for each plan schedule (torch's schedule names).
TORCHTITAN_SCHEDULES = {Schedule.ONE_F_ONE_B: "1F1B", Schedule.GPIPE: "GPipe",
                        Schedule.INTERLEAVED_1F1B: "Interleaved1F1B"}
# The activation_checkpoint policy: a subcommand in torchtitan 0.3's flags, `mode` in the toml.
FULL_AC, NO_AC = "full", "none"


def _sections(plan: Plan, kinds: Sequence[str], global_batch_size: int, schedule: Schedule,
              *, head: str) -> dict[str, dict[str, Any]]:
    """The settings the plan decides, by config section. With one stage there is no
    pipeline: micro-batches become gradient accumulation (local batch = one micro-batch).
    With several chunks per stage the model parts are the model chunks, in model order."""
    first = plan.pipelines[0]
    tp, pp, dp = first.stages[0].tp, len(first.stages), len(plan.pipelines)
    parallelism: dict[str, Any] = {
        "data_parallel_replicate_degree": dp,
        "data_parallel_shard_degree": 1,
        "tensor_parallel_degree": tp,
        "pipeline_parallel_degree": pp,
    }
    local_batch_size = first.micro_batch_size
    if pp > 1:
        local_batch_size *= first.num_micro_batches
        parallelism |= {
            "pipeline_parallel_schedule": TORCHTITAN_SCHEDULES[schedule],
            "pipeline_parallel_microbatch_size": first.micro_batch_size,
            "module_fqns_per_model_part": [_torchtitan_names(kinds, chunk, head=head)
                                           for chunk in model_chunks(first)],
        }
    training = {"local_batch_size": local_batch_size, "global_batch_size": global_batch_size}
    return {"parallelism": parallelism, "training": training}


def _flags(sections: dict[str, dict[str, Any]]) -> list[str]:
    """`--section.key value`; a list of lists is one comma-joined word per inner list."""
    args: list[str] = []
    for section, values in sections.items():
        for key, value in values.items():
            args.append(f"--{section}.{key}")
            if isinstance(value, list):
                args.extend(",".join(part) for part in value)
            else:
                args.append(str(value))
    return args


def _toml(sections: dict[str, dict[str, Any]], activation_checkpoint: str) -> str:
    # JSON writes these values (ints, ASCII strings, lists of them) exactly as TOML does.
    lines: list[str] = []
    for section, values in (sections | {"activation_checkpoint":
                                        {"mode": activation_checkpoint}}).items():
        lines.append(f"[{section}]")
        lines.extend(f"{key} = {json.dumps(value)}" for key, value in values.items())
        lines.append("")
    return "\n".join(lines)


def _torchtitan_reasons(plan: Plan, kinds: Sequence[str], schedule: Schedule) -> list[str]:
    reasons = (_uniform_reasons(plan, "torchtitan", schedule, tuple(TORCHTITAN_SCHEDULES))
               + _kind_reasons(kinds, "torchtitan") + _recompute_all(plan, "torchtitan")[1])
    if reasons or _effective_schedule(plan, schedule) is not Schedule.INTERLEAVED_1F1B:
        return reasons
    first = plan.pipelines[0]
    pp, m = len(first.stages), first.num_micro_batches
    if pp == 1:
        return [f"{_chunks_per_stage(plan)} chunks on a single stage; torchtitan pipelines only "
                "with pipeline_parallel_degree > 1, so give the stage one range"]
    rounds = max(1, m // pp)
    if m % rounds:
        return [f"{m} micro-batches on {pp} stages; torch's ScheduleInterleaved1F1B (torchtitan's "
                f"Interleaved1F1B) runs max(1, {m} // {pp}) = {rounds} rounds and needs the "
                "micro-batch count to be a multiple of that"]
    return []


def export_torchtitan(plan: Plan, *, layer_kinds: Sequence[str] | None = None,
                      job_schedule: str | None = None) -> dict[str, Any]:
    """torchtitan settings for a plan whose pipelines are identical replicas."""
    ranks = build_rank_map(plan)
    kinds = _kinds(ranks.num_layers, layer_kinds)
    schedule = _effective_schedule(plan, _schedule(plan, job_schedule))
    reasons = _torchtitan_reasons(plan, kinds, schedule)
    if not reasons:
        nodes, placement_reasons = _grid_placement(plan, ranks, TP_DP_PP)
        reasons += [f"{reason}; torchtitan's mesh has one order (pp, dp, tp)"
                    for reason in placement_reasons]
    if reasons:
        raise UnsupportedExport("torchtitan", reasons)
    recompute = _recompute_all(plan, "torchtitan")[0]
    activation_checkpoint = FULL_AC if recompute else NO_AC
    sections = _sections(plan, kinds, ranks.global_batch_size, schedule, head=LM_HEAD)
    toml_sections = _sections(plan, kinds, ranks.global_batch_size, schedule,
                              head=LM_HEAD_BEFORE_0_3)
    return {
        "format": "torchtitan",
        "config": sections,
        "activation_checkpoint": activation_checkpoint,
        "args": [*_flags(sections), f"activation_checkpoint:{activation_checkpoint}"],
        "toml": _toml(toml_sections, activation_checkpoint),
        "nodes": nodes,
        "notes": [
            "torchtitan 0.3: append args to --module <model> --config <config function>; "
            "flags override the config function's values. The last one chooses the "
            "activation_checkpoint policy (a subcommand: it must come after the flags).",
            "Releases before 0.3 read the toml with --job.config_file; their LM head module "
            f"is {LM_HEAD_BEFORE_0_3!r}, not {LM_HEAD!r}, and the toml names it so.",
            "data_parallel_shard_degree 1 keeps whole replicas, as the plan's memory assumes; "
            "sharding (FSDP) changes memory and communication from what was planned.",
            "Launch each node with torchrun --node-rank=<node_rank> --nproc-per-node="
            "<nproc_per_node> and its CUDA_VISIBLE_DEVICES so that rank r lands on the plan's "
            "GPU.",
            *([RECOMPUTE_NOTE] if recompute else []),
            *_schedule_notes(plan, job_schedule),
        ],
    }


RECOMPUTE_NOTE = (
    "Recompute: torchtitan's full activation checkpointing wraps each transformer block on "
    "its own, so a stage keeps the input of every block of an in-flight micro-batch (the plan "
    "keeps one input per chunk) and never recomputes the embedding or the output layer; the "
    "time matches the plan's, the memory is somewhat above its estimate.")
