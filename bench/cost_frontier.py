"""Money benchmarks: the cost/throughput frontier of every shared scenario, and a what-if
sweep of many fleet variants on local processes against a local Ray.

`frontier`: for each scenario in tests/data/scenarios, the frontier over its sub-fleets
(points, cheapest, fastest, wall time on `--jobs` processes), then, planned separately,
the whole-node plan of every subset of its GPU types; each such point must be matched
or beaten by a frontier point (at least 0.99x its samples/s at no more USD/hour).

`sweep`: `--variants` what-if variants (nodes added or removed per type, inter-node
bandwidth changed) of a shared scenario scaled to `--gpus` GPUs (bench/plan_time.py's
`scaled`), planned on `--jobs` local processes and then as Ray tasks on a local Ray with
`--jobs` CPUs; then Ray's own cost per task, from empty tasks.

Usage: python bench/cost_frontier.py frontier [--time-limit 1] [--jobs 2]
       python bench/cost_frontier.py sweep [--gpus 512] [--variants 200] [--jobs 2]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from plan_time import SCENARIOS, scaled  # noqa: E402

import planner  # noqa: E402
from api.sweeps import local_mapper, ray_mapper  # noqa: E402
from planner import fleet  # noqa: E402

MATCH = 0.99


def frontier_row(path: Path, time_limit_s: float, jobs: int) -> dict[str, Any]:
    scenario = planner.parse_scenario(json.loads(path.read_text()))
    options = planner.SearchOptions(time_limit_s=time_limit_s)
    fleets = fleet.sub_fleets(scenario)
    started = time.perf_counter()
    with local_mapper(jobs) as mapper:
        points = fleet.frontier(fleet.plan_fleets(fleets, options, mapper=mapper))
    wall_s = time.perf_counter() - started
    types = sorted({n.gpu_type for n in scenario.cluster.nodes})
    subsets = [s for k in range(1, len(types) + 1) for s in itertools.combinations(types, k)]
    references = [fleet.Fleet(label="+".join(s), scenario=fleet.with_nodes(
        scenario, [n for n in scenario.cluster.nodes if n.gpu_type in s])) for s in subsets]
    with local_mapper(jobs) as mapper:
        reached = fleet.plan_fleets(references, options, mapper=mapper)
    unmatched = [f"{r.label}: {r.samples_per_s:.4g}/s ${r.usd_per_hour:.4g}/h"
                 for r in reached if r.priced and not any(
                     (p.samples_per_s or 0) >= MATCH * (r.samples_per_s or 0)
                     and (p.usd_per_hour or 0) <= (r.usd_per_hour or 0) + 1e-9 for p in points)]
    cheapest, fastest = points[0], points[-1]
    return {"scenario": path.stem, "types": len(types), "fleets": len(fleets),
            "points": len(points), "wall_s": round(wall_s, 1),
            "cheapest": [round(cheapest.samples_per_s or 0, 1), cheapest.usd_per_hour,
                         cheapest.label],
            "fastest": [round(fastest.samples_per_s or 0, 1), fastest.usd_per_hour,
                        fastest.label],
            "subsets": len(reached), "unmatched": unmatched}


def variants(scenario: planner.Scenario, count: int) -> list[fleet.FleetVariant]:
    """`count` fleet changes cycling over types, sizes and kinds of change."""
    types = sorted({n.gpu_type for n in scenario.cluster.nodes})
    made = []
    for i in range(count):
        gpu_type, size = types[i % len(types)], 1 + (i // 4) % 8
        kind = (i // len(types)) % 4
        if kind == 0:
            change: dict[str, Any] = {"add": [{"gpu_type": gpu_type, "nodes": size}]}
        elif kind == 1:
            change = {"remove": [{"gpu_type": gpu_type, "nodes": size}]}
        elif kind == 2:
            change = {"inter_node": {"bandwidth_gb_per_s": 5.0 * size}}
        else:
            other = types[(i + 1) % len(types)]
            change = {"add": [{"gpu_type": gpu_type, "nodes": size}],
                      "remove": [{"gpu_type": other, "nodes": size}]}
        made.append(fleet.FleetVariant.model_validate({"name": f"v{i}", **change}))
    return made


def _empty(item: int) -> int:
    return item


def sweep(name: str, gpus: int, count: int, jobs: int, time_limit_s: float,
          engines: list[str]) -> dict[str, Any]:
    scenario = planner.parse_scenario(scaled(name, gpus))
    changes = variants(scenario, count)
    options = planner.SearchOptions(time_limit_s=time_limit_s)
    walls: dict[str, float] = {}
    plans: dict[str, list[float | None]] = {}
    mappers = {"processes": lambda: local_mapper(jobs), "ray": lambda: ray_mapper("auto", jobs)}
    for engine in engines:
        mapper_of = mappers[engine]
        started = time.perf_counter()
        with mapper_of() as mapper:
            rows = fleet.what_if(scenario, changes, options, mapper=mapper)
        walls[engine] = time.perf_counter() - started
        plans[engine] = [r.samples_per_s for r in rows]
    row: dict[str, Any] = {"scenario": name, "gpus": scenario.cluster.num_gpus,
                           "variants": count, "jobs": jobs, "time_limit_s": time_limit_s,
                           **{f"{e}_wall_s": round(w, 1) for e, w in walls.items()}}
    if "ray" not in engines:
        return row
    with ray_mapper("auto", jobs) as mapper:
        list(mapper(_empty, range(10)))  # workers started
        started = time.perf_counter()
        list(mapper(_empty, range(2000)))
        row["empty_tasks_per_s"] = round(2000 / (time.perf_counter() - started))
    if len(plans) == 2:
        same = sum(a == b for a, b in zip(plans["processes"], plans["ray"], strict=True))
        row["ray_extra_per_task_ms"] = round(
            (walls["ray"] - walls["processes"]) / (count + 1) * 1e3, 1)
        row["same_throughput"] = f"{same}/{count + 1}"
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["frontier", "sweep"])
    parser.add_argument("--time-limit", type=float, default=1.0)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--gpus", type=int, default=512)
    parser.add_argument("--variants", type=int, default=200)
    parser.add_argument("--scenario", default="a80x16-v32x16-gpt1.3b")
    parser.add_argument("--engines", default="processes,ray",
                        help="Where the sweep runs, in order: processes, ray.")
    args = parser.parse_args()
    if args.what == "frontier":
        for path in sorted(SCENARIOS.glob("*.json")):
            print(json.dumps(frontier_row(path, args.time_limit, args.jobs)), flush=True)
    else:
        print(json.dumps(sweep(args.scenario, args.gpus, args.variants, args.jobs,
                               args.time_limit, args.engines.split(","))), flush=True)


if __name__ == "__main__":
    main()
