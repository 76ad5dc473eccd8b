"""Which layers each process of a launched plan holds, and which gradients it sums with whom.

The rank map (`planner.export.ranks`) numbers the processes, forms the TP groups
and splits the batch. Under interleaved-1f1b a stage holds several chunks (model
chunk `c = j * S + s` is chunk `j` of stage `s`); here:

- `launch_rank_map` is the rank map, which reads chunks (`RankInfo.chunks`, sync
  groups over every chunk);
- `sync_groups` groups consecutive layers held by the same stages from each
  pipeline's model chunks, as the rank map does (kept, and tested equal to it);
- `launch_problems` lists what the workers could not run: a chunk layout that
  does not cover the model, chunks under another schedule, an interleaved
  pipeline whose micro-batches are not a multiple of its stages, or local
  pipelines with different blocks.
"""

from __future__ import annotations

from planner.documents import LayerRange, Pipeline, Plan, Schedule
from planner.export.ranks import RankMap, StageRef, SyncGroup, build_rank_map
from planner.schedules import chunk_layout_errors, model_chunks

__all__ = ["launch_rank_map", "sync_groups", "launch_problems", "stage_of_layers"]


def stage_of_layers(pipeline: Pipeline) -> list[int]:
    """The stage holding each layer of the model, in layer order."""
    num_stages = len(pipeline.stages)
    holders: list[int] = []
    for c, (start, end) in enumerate(model_chunks(pipeline)):
        holders += [c % num_stages] * (end - start)
    return holders


def sync_groups(plan: Plan, ranks: RankMap) -> tuple[SyncGroup, ...]:
    """Consecutive layers held by the same stage of every pipeline share one group: TP rank
    `t` of each holder with TP rank `t` of the others when all have one TP degree
    (`sharded`), else every GPU of every holder (`resharded`)."""
    holders_by_pipeline = [stage_of_layers(p) for p in plan.pipelines]
    num_layers = len(holders_by_pipeline[0])
    groups: list[SyncGroup] = []
    start = 0
    for layer in range(1, num_layers + 1):
        holders = tuple(StageRef(pipeline=p, stage=stages[start], tp_size=plan.pipelines[p]
                                 .stages[stages[start]].tp)
                        for p, stages in enumerate(holders_by_pipeline))
        if layer < num_layers and all(stages[layer] == stages[start]
                                      for stages in holders_by_pipeline):
            continue
        members = [ranks.stage_ranks(h.pipeline, h.stage) for h in holders]
        if len({h.tp_size for h in holders}) == 1:
            groups.append(SyncGroup(layers=(start, layer), holders=holders, kind="sharded",
                                    rank_groups=tuple(zip(*members, strict=True))))
        else:
            groups.append(SyncGroup(layers=(start, layer), holders=holders, kind="resharded",
                                    rank_groups=(tuple(r for m in members for r in m),)))
        start = layer
    return tuple(groups)


def launch_rank_map(plan: Plan) -> RankMap:
    """The rank map of `plan`: `build_rank_map` now reads chunks itself (each rank's `chunks`,
    the sync groups of every chunk, the link from the last stage back to the first). Call it
    once `launch_problems` finds nothing: a broken chunk layout is `InvalidPlan` there."""
    return build_rank_map(plan)


def launch_problems(plan: Plan, schedule: Schedule, num_layers: int) -> list[str]:
    """Why the workers could not run `plan` under `schedule` on a model of `num_layers`."""
    problems: list[str] = []
    for i, pipeline in enumerate(plan.pipelines):
        where = f"pipelines[{i}]"
        num_chunks = max(stage.num_chunks for stage in pipeline.stages)
        if num_chunks > 1 and schedule is not Schedule.INTERLEAVED_1F1B:
            problems.append(f"{where}: stages hold {num_chunks} chunks but the schedule is "
                            f"'{schedule}'; chunks run under 'interleaved-1f1b' only")
            continue
        layout = chunk_layout_errors(where, pipeline, num_layers)
        problems += layout
        num_stages, m = len(pipeline.stages), pipeline.num_micro_batches
        if not layout and num_chunks > 1 and m % num_stages:
            problems.append(f"{where}: num_micro_batches is {m}, not a multiple of its "
                            f"{num_stages} stages, which interleaved-1f1b with chunks needs")
    if schedule is Schedule.LOCAL and not problems:  # one range per stage from here on
        blocks = _blocks(plan.pipelines[0])
        problems += [f"pipelines[{i}]: blocks {_blocks(p)} differ from pipelines[0]'s {blocks}; "
                     "under 'local' every pipeline has the same stage boundaries"
                     for i, p in enumerate(plan.pipelines) if _blocks(p) != blocks]
    return problems


def _blocks(pipeline: Pipeline) -> list[LayerRange]:
    return [stage.layers for stage in pipeline.stages]
