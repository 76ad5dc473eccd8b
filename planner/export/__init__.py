"""Plans for launchers: the rank map and exports to torchrun, torch.distributed.pipelining,
Megatron-LM, DeepSpeed, torchtitan, Kubernetes (JobSet) and Slurm. Pure: no torch, no I/O.

    rank_map(plan)                 -> JSON-ready ranks and process groups
    export_plan(plan, fmt, **opts) -> JSON-ready launcher settings, or UnsupportedExport
    expressible(plan, fmt)         -> None if fmt can run the plan, else the reasons
"""

from planner.export.dispatch import (
    FORMATS,
    export_plan,
    export_with_scenario,
    expressible,
    format_options,
    parse_gpu_names,
    scenario_options,
)
from planner.export.ranks import RANK_MAP_FORMAT, RankMap, build_rank_map, rank_map

__all__ = ["FORMATS", "RANK_MAP_FORMAT", "RankMap", "build_rank_map", "export_plan",
           "export_with_scenario", "expressible", "format_options", "parse_gpu_names",
           "rank_map", "scenario_options"]
