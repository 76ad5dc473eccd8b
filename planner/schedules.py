"""What the version 1.1 schedules add to a plan's rules (docs/formats.md, version 1.1 schedules).

The layout of model chunks (chunk `j` of stage `s` is model chunk `j * S + s`), the
validity rules that interleaving and local learning bring, and activation memory as the
peak of what a stage's own operation order holds at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from planner.costs import ProfileIndex
from planner.documents import LayerRange, Pipeline, Plan, Scenario, Schedule
from planner.simulate import FORWARD, Operation

__all__ = [
    "model_chunks",
    "chunk_layout_errors",
    "schedule_errors",
    "held_peak",
]


def model_chunks(pipeline: Pipeline) -> list[LayerRange]:
    """The pipeline's layer ranges in model order: chunk `j` of stage `s` is model chunk
    `j * S + s`. Every stage must hold the same number of chunks (`chunk_layout_errors`)."""
    stages = pipeline.stages
    ranges = [stage.ranges for stage in stages]
    return [ranges[s][j] for j in range(len(ranges[0])) for s in range(len(stages))]


def chunk_layout_errors(where: str, pipeline: Pipeline, num_layers: int) -> list[str]:
    """Same number of chunks on every stage; model chunks cover [0, L) in order, none empty."""
    stages = pipeline.stages
    first = stages[0].num_chunks
    errors = [
        f"{where}.stages[{s}]: holds {stage.num_chunks} chunk(s) but stages[0] holds {first}; "
        "every stage of a pipeline holds the same number of chunks"
        for s, stage in enumerate(stages) if stage.num_chunks != first
    ]
    if errors:
        return errors
    num_stages, expected = len(stages), 0
    for c, (start, end) in enumerate(model_chunks(pipeline)):
        if start != expected or end <= start or end > num_layers:
            errors.append(
                f"{where}.stages[{c % num_stages}].chunks[{c // num_stages}]: [{start}, {end}) is "
                f"model chunk {c} and does not continue the model at layer {expected} with a "
                f"non-empty range inside [0, {num_layers}); chunk j of stage s must follow model "
                f"chunk j * {num_stages} + s - 1")
        expected = end
    if expected != num_layers:
        errors.append(f"{where}: model chunks end at layer {expected}, not at {num_layers}; they "
                      "must cover every layer")
    return errors


def schedule_errors(
    scenario: Scenario, plan: Plan, schedule: Schedule, profiles: ProfileIndex
) -> list[str]:
    """The rules a plan's schedule adds to section 2's."""
    errors: list[str] = []
    job_schedule = scenario.job.schedule
    if schedule is Schedule.LOCAL and job_schedule is not Schedule.LOCAL:
        errors.append(f"schedule: the plan runs 'local' but job.schedule is '{job_schedule}'; local "
                      "learning changes what training computes, so only a job whose schedule is "
                      "'local' may run it")
    for i, pipeline in enumerate(plan.pipelines):
        num_stages, m = len(pipeline.stages), pipeline.num_micro_batches
        if schedule is not Schedule.INTERLEAVED_1F1B:
            errors.extend(
                f"pipelines[{i}].stages[{s}]: holds {stage.num_chunks} chunks but the plan's "
                f"schedule is '{schedule}'; chunks need 'interleaved-1f1b' (or give the stage one "
                "range in `layers`)"
                for s, stage in enumerate(pipeline.stages) if stage.num_chunks > 1)
            continue
        num_chunks = pipeline.stages[0].num_chunks
        if num_chunks >= 2 and m % num_stages != 0:
            errors.append(
                f"pipelines[{i}]: num_micro_batches is {m}, not a multiple of its {num_stages} "
                f"stages, which interleaved-1f1b with {num_chunks} chunks per stage needs; use "
                f"{m - m % num_stages or num_stages} or {m - m % num_stages + num_stages}")
    if schedule is Schedule.LOCAL:
        errors.extend(_local_errors(scenario, plan, profiles))
    return errors


def _local_errors(scenario: Scenario, plan: Plan, profiles: ProfileIndex) -> list[str]:
    """A head kind, profiled wherever a stage trains through it; one set of blocks."""
    head = scenario.job.local_head_kind
    if head is None:
        return ["job.local_head_kind: not set; schedule 'local' trains every stage but the last "
                "through an auxiliary head: name its kind (declared in model.kinds)"]
    errors = []
    blocks = [stage.ranges for stage in plan.pipelines[0].stages]
    for i, pipeline in enumerate(plan.pipelines):
        theirs = [stage.ranges for stage in pipeline.stages]
        if theirs != blocks:
            errors.append(f"pipelines[{i}]: stage layers {_shown(theirs)} differ from pipelines[0]'s "
                          f"{_shown(blocks)}; under 'local' every pipeline has the same blocks "
                          "(stage boundaries), though types, tp and micro-batches may differ")
        b = pipeline.micro_batch_size
        for s, stage in enumerate(pipeline.stages[:-1]):
            if profiles.get(stage.gpu_type, head, b, stage.tp) is None:
                errors.append(
                    f"pipelines[{i}].stages[{s}]: no profile row for the local head "
                    f"({stage.gpu_type}, {head}, micro_batch {b}, tp {stage.tp}); every stage but "
                    "the last trains through it: profile that point or choose another")
    return errors


def _shown(blocks: list[list[LayerRange]]) -> str:
    return str([[list(r) for r in ranges] for ranges in blocks])


def held_peak(order: Sequence[Operation], held_bytes: Mapping[int, float]) -> tuple[int, float]:
    """(most micro-batch forwards held at once, most bytes held at once) over one stage's
    operation order: a forward of model chunk c adds `held_bytes[c]`, its backward frees
    them. For 1F1B that is min(S - s, m) forwards, for GPipe m."""
    count = most_count = 0
    held = most_held = 0.0
    for chunk, direction, _ in order:
        if direction == FORWARD:
            count += 1
            held += held_bytes[chunk]
            most_count = max(most_count, count)
            most_held = max(most_held, held)
        else:
            count -= 1
            held -= held_bytes[chunk]
    return most_count, most_held
