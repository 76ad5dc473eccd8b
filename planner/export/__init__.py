"""Plans for launchers: the rank map and exports to torchrun, torch.distributed.pipelining,
Megatron-LM and DeepSpeed. Pure: no torch, no I/O.

    rank_map(plan)                 -> JSON-ready ranks and process groups
    export_plan(plan, fmt, **opts) -> JSON-ready launcher settings, or UnsupportedExport
"""

from planner.export.formats import FORMATS, export_plan
from planner.export.ranks import RANK_MAP_FORMAT, RankMap, build_rank_map, rank_map

__all__ = ["FORMATS", "RANK_MAP_FORMAT", "RankMap", "build_rank_map", "export_plan", "rank_map"]
