"""Plan quality off the shared set: the shared scenarios perturbed, as held-out inputs of
the same families would be.

Each input is a shared generated scenario (tests/data/scenarios; with --family measured,
a measured one, bench/scenarios/measured) changed at random, with a seed: each GPU type's
node count scaled by 0.5-3 (at least one node), sometimes a type of three or more dropped,
one network interface per node, the global batch halved or doubled, a third of the nodes
moved to a second zone behind a slow link, ZeRO-1. No per-type reference exists for them,
so hetplan is compared with its own `per_type` baseline (which reaches the shared per-type
reference on every shared scenario, section 1) and with the best of its three baselines;
the gap to the upper bound and the idle GPUs are shown too.

With --scale K every node is repeated K times and the batch multiplied by K (the same
draws: input #i at scale K is K copies of input #i at scale 1), for held-out inputs of
hundreds of GPUs; the plan is then also compared with the scale-1 input's plan laid down K
times, the pod a careful engineer would plan once and repeat.

Usage: python bench/perturbed.py [--count N] [--seed S] [--time-limit S] [--scale K]
                                 [--family generated|measured]
Prints a Markdown table and the geometric means for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import time
from collections.abc import Callable
from typing import Any

from plan_quality import SETS, geomean  # the shared sets, judged the same way

from planner import SearchOptions, evaluate, parse_plan, parse_scenario, plan
from planner.documents import Plan, Scenario

FAMILIES = ("generated", "measured")
WAN_LINKS = [(1.25, 10_000.0), (3.0, 2_000.0), (10.0, 2_000.0)]
"""(GB/s, latency us) of the link to a second zone."""


def perturbed(rng: random.Random, family: str = "generated") -> tuple[str, dict[str, Any]]:
    """One perturbed scenario of `family`'s shared set and a label saying what changed."""
    path = rng.choice(SETS[family])
    doc = json.loads(path.read_text())
    cluster, job = doc["cluster"], doc["job"]
    changes = []
    types = sorted({node["gpu_type"] for node in cluster["nodes"]})
    if len(types) >= 3 and rng.random() < 0.3:
        dropped = rng.choice(types)
        cluster["nodes"] = [n for n in cluster["nodes"] if n["gpu_type"] != dropped]
        changes.append(f"no {dropped}")
    nodes = []
    for gpu_type in sorted({node["gpu_type"] for node in cluster["nodes"]}):
        mine = [n for n in cluster["nodes"] if n["gpu_type"] == gpu_type]
        count = max(1, round(len(mine) * rng.choice([0.5, 1, 1, 2, 3])))
        nodes += [dict(mine[i % len(mine)], name=f"{mine[0]['name']}-p{i}") for i in range(count)]
        changes.append(f"{gpu_type} x{sum(n['gpus'] for n in nodes if n['gpu_type'] == gpu_type)}")
    cluster["nodes"] = nodes
    if rng.random() < 0.3:
        for node in nodes:
            node["nics"] = 1
        changes.append("one NIC per node")
    job["global_batch_size"] = max(8, int(job["global_batch_size"] * rng.choice([0.5, 1, 2])))
    changes.append(f"batch {job['global_batch_size']}")
    if rng.random() < 0.25 and not cluster.get("inter_zone"):
        for node in nodes:
            node["zone"] = "a"
        for node in rng.sample(nodes, max(1, len(nodes) // 3)):
            node["zone"] = "b"
        bandwidth, latency = rng.choice(WAN_LINKS)
        cluster["inter_zone"] = [{"zones": ["a", "b"], "bandwidth_gb_per_s": bandwidth,
                                  "latency_us": latency}]
        changes.append(f"two zones ({bandwidth:g} GB/s)")
    if rng.random() < 0.3:
        job["zero_stage"] = 1
        changes.append("ZeRO-1")
    return f"{path.stem}: {', '.join(changes)}", doc


def scaled(doc: dict[str, Any], copies: int) -> dict[str, Any]:
    """`copies` of every node (named apart) and the batch multiplied to match."""
    doc = json.loads(json.dumps(doc))
    doc["cluster"]["nodes"] = [dict(node, name=f"{node['name']}-c{c}") for c in range(copies)
                               for node in doc["cluster"]["nodes"]]
    doc["job"]["global_batch_size"] *= copies
    return doc


def laid_down(small: Plan, copies: int, node_of: Callable[[str, int], str]) -> Plan:
    """`small`'s pipelines laid down once per copy, each GPU on node `node_of(node, copy)`
    (its estimate and search sections dropped: they describe `small`)."""
    doc = small.model_dump(mode="json", exclude_none=True)
    doc.pop("estimate", None)
    doc.pop("search", None)
    pipelines = []
    for c in range(copies):
        for pipeline in doc["pipelines"]:
            copy = json.loads(json.dumps(pipeline))
            for stage in copy["stages"]:
                stage["gpus"] = [f"{node_of(node, c)}:{index}"
                                 for node, _, index in (g.rpartition(":") for g in stage["gpus"])]
            pipelines.append(copy)
    doc["pipelines"] = pipelines
    return parse_plan(doc)


def tiled(small: Plan, copies: int) -> Plan:
    """`small`'s pipelines laid down once on each copy of its nodes (as `scaled` names them)."""
    return laid_down(small, copies, lambda node, c: f"{node}-c{c}")


def tiled_rate(small_doc: dict[str, Any], scenario: Scenario, copies: int,
               time_limit_s: float) -> float:
    """Samples/s of the scale-1 input's plan laid down `copies` times on `scenario`."""
    small = plan(parse_scenario(small_doc), SearchOptions(time_limit_s=time_limit_s))
    return evaluate(scenario, tiled(small.plan, copies)).samples_per_s or 0.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--scale", type=int, default=1,
                        help="repeat every node this many times, the batch with them")
    parser.add_argument("--family", choices=FAMILIES, default="generated",
                        help="the shared set whose scenarios are perturbed")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    print(f"machine: {platform.machine()}, Python {platform.python_version()}, "
          f"date {time.strftime('%Y-%m-%d %H:%M')}, seed {args.seed}, {args.count} scenarios, "
          f"scale {args.scale}, {args.family} family\n")
    tiles = args.scale > 1
    print("| # | scenario | GPUs | hetplan samples/s | per_type baseline | vs per_type | "
          "vs best baseline | " + ("scale-1 plan tiled | vs tiled | " if tiles else "")
          + "gap to upper bound | idle GPUs | plan s |")
    print("|---" * (12 if tiles else 10) + "|")
    vs_per_type, vs_best, vs_tiled = [], [], []
    for k in range(args.count):
        label, small_doc = perturbed(rng, args.family)
        doc = scaled(small_doc, args.scale) if tiles else small_doc
        scenario = parse_scenario(doc)
        gpus = scenario.cluster.num_gpus
        started = time.perf_counter()
        result = plan(scenario, SearchOptions(time_limit_s=args.time_limit))
        wall = time.perf_counter() - started
        ours = result.evaluation.samples_per_s or 0.0
        per_type = result.baselines.get("per_type")
        best = max((v for v in result.baselines.values() if v), default=math.nan)
        upper = (result.plan.search or {}).get("upper_bound_samples_per_s") or math.nan
        if per_type:
            vs_per_type.append(ours / per_type)
        vs_best.append(ours / best)
        tile_cells = ""
        if tiles:
            tile = tiled_rate(small_doc, scenario, args.scale, args.time_limit)
            vs_tiled.append(ours / tile)
            tile_cells = f"{tile:.2f} | {ours / tile:.3f}x | "
        print(f"| {k} | {label} | {gpus} | {ours:.2f} | {per_type or math.nan:.2f} | "
              f"{ours / (per_type or math.nan):.3f}x | {ours / best:.3f}x | {tile_cells}"
              f"{1 - ours / upper:.3f} | {len(result.unused_gpus)} | {wall:.2f} |", flush=True)
    print(f"\ngeometric mean {geomean(vs_per_type):.3f}x the per_type baseline "
          f"(lowest {min(vs_per_type):.3f}x, {sum(v < 1.005 for v in vs_per_type)} of "
          f"{len(vs_per_type)} within 0.5% of it); {geomean(vs_best):.3f}x the best baseline "
          f"(lowest {min(vs_best):.3f}x)"
          + (f"; {geomean(vs_tiled):.3f}x the scale-1 plans tiled (lowest {min(vs_tiled):.3f}x, "
             f"{sum(v < 0.995 for v in vs_tiled)} more than 0.5% below)" if tiles else ""))


if __name__ == "__main__":
    main()
