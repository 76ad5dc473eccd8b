"""Plan quality off the shared set: the generated scenarios perturbed, as held-out inputs of
the same families would be.

Each input is a shared generated scenario (tests/data/scenarios) changed at random, with a
seed: each GPU type's node count scaled by 0.5-3 (at least one node), sometimes a type of
three or more dropped, one network interface per node, the global batch halved or doubled,
a third of the nodes moved to a second zone behind a slow link, ZeRO-1. No per-type
reference exists for them, so hetplan is compared with its own `per_type` baseline (which
reaches the shared per-type reference on every shared scenario, section 1) and with the
best of its three baselines; the gap to the upper bound and the idle GPUs are shown too.

Usage: python bench/perturbed.py [--count N] [--seed S] [--time-limit S]
Prints a Markdown table and the geometric means for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import time
from typing import Any

from plan_quality import SETS, geomean  # the shared generated set, judged the same way

from planner import SearchOptions, parse_scenario, plan

GENERATED = SETS["generated"]
WAN_LINKS = [(1.25, 10_000.0), (3.0, 2_000.0), (10.0, 2_000.0)]
"""(GB/s, latency us) of the link to a second zone."""


def perturbed(rng: random.Random) -> tuple[str, dict[str, Any]]:
    """One perturbed scenario and a label saying what changed."""
    path = rng.choice(GENERATED)
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-limit", type=float, default=10.0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    print(f"machine: {platform.machine()}, Python {platform.python_version()}, "
          f"date {time.strftime('%Y-%m-%d %H:%M')}, seed {args.seed}, {args.count} scenarios\n")
    print("| # | scenario | GPUs | hetplan samples/s | per_type baseline | vs per_type | "
          "vs best baseline | gap to upper bound | idle GPUs | plan s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    vs_per_type, vs_best = [], []
    for k in range(args.count):
        label, doc = perturbed(rng)
        scenario = parse_scenario(doc)
        gpus = sum(n.gpus for n in scenario.cluster.nodes)
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
        print(f"| {k} | {label} | {gpus} | {ours:.2f} | {per_type or math.nan:.2f} | "
              f"{ours / (per_type or math.nan):.3f}x | {ours / best:.3f}x | "
              f"{1 - ours / upper:.3f} | {len(result.unused_gpus)} | {wall:.2f} |", flush=True)
    print(f"\ngeometric mean {geomean(vs_per_type):.3f}x the per_type baseline "
          f"(lowest {min(vs_per_type):.3f}x, {sum(v < 1.005 for v in vs_per_type)} of "
          f"{len(vs_per_type)} within 0.5% of it); {geomean(vs_best):.3f}x the best baseline "
          f"(lowest {min(vs_best):.3f}x)")


if __name__ == "__main__":
    main()
