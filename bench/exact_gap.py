"""The default search, and its templates and allocation alone, against the proven optimum
(exact mode, an enumeration independent of both) on small random scenarios.

Usage: python bench/exact_gap.py [--count N] [--seed S] [--family random|tiny]
       [--time-limit S]
`random`: 2-3 GPUs of two types on two nodes, 2-4 layers, micro-batch sizes 1 and 2, a
batch of 2-8 sequences, random speeds, memory and links. `tiny`: the five tiny scenarios
(6-8 GPUs of two or three types, 6-8 layers) changed at random: the batch halved or
doubled, each type's speed scaled by 0.7-1.4, at times a GPU taken off a node; a stand-in
for held-out scenarios of their family. Only scenarios whose optimum exact mode proves
within its time limit are counted.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time

from plan_quality import tiny_scenarios

from planner import Infeasible, PlanStatus, SearchOptions, parse_scenario, plan
from planner.search.exact import TooLargeForExact


def random_scenario(rng: random.Random) -> dict:
    fast_gpus, slow_gpus = rng.choice([(2, 1), (1, 2), (2, 0), (1, 1)])
    slow = rng.uniform(1.2, 3.0)
    layers = rng.randint(2, 4)
    nodes = [{"name": "f0", "gpu_type": "F", "gpus": fast_gpus, "nics": rng.choice([1, 2])}]
    if slow_gpus:
        nodes.append({"name": "s0", "gpu_type": "S", "gpus": slow_gpus})
    rows = []
    for gpu_type, factor in (("F", 1.0), ("S", slow)):
        for b in (1, 2):
            for kind, ms in (("embed", 0.5), ("block", 2.0)):
                rows.append({"gpu_type": gpu_type, "kind": kind, "micro_batch": b, "tp": 1,
                             "forward_ms": ms * factor * b * 0.8,
                             "backward_ms": 2 * ms * factor * b * 0.8,
                             "activation_bytes": 1e8 * b})
    return {
        "format": "hetplan-scenario/1",
        "gpu_types": {"F": {"memory_gib": 3.0}, "S": {"memory_gib": rng.choice([2.3, 2.6, 3.0])}},
        "cluster": {
            "nodes": nodes,
            "intra_node": {"F": {"bandwidth_gb_per_s": 100, "latency_us": 5},
                           "S": {"bandwidth_gb_per_s": 50, "latency_us": 5}},
            "inter_node": {"bandwidth_gb_per_s": rng.choice([1, 10, 25]), "latency_us": 10},
        },
        "model": {"name": "small", "seq_len": 1024, "layers": ["embed"] + ["block"] * (layers - 1),
                  "kinds": {"embed": {"params": 5e7, "output_bytes_per_sample": 4e6},
                            "block": {"params": 2e7, "output_bytes_per_sample": 4e6}}},
        "profiles": rows,
        "job": {"global_batch_size": rng.choice([2, 4, 6, 8]), "grad_bytes": 2},
    }


def perturbed_tiny(rng: random.Random) -> dict:
    doc = json.loads(rng.choice(tiny_scenarios()).read_text())
    job = doc["job"]
    job["global_batch_size"] = max(1, int(job["global_batch_size"] * rng.choice([0.5, 1, 2])))
    speed = {t: rng.uniform(0.7, 1.4) for t in doc["gpu_types"]}
    for row in doc["profiles"]:
        row["forward_ms"] *= speed[row["gpu_type"]]
        row["backward_ms"] *= speed[row["gpu_type"]]
    if rng.random() < 0.5:
        node = rng.choice([n for n in doc["cluster"]["nodes"] if n["gpus"] > 1] or [None])
        if node is not None:
            node["gpus"] -= 1
            node.pop("nics", None)
    return doc


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--family", choices=["random", "tiny"], default="random")
    parser.add_argument("--time-limit", type=float, default=2.0,
                        help="the default search's time limit, its enumeration's included")
    args = parser.parse_args()
    draw = random_scenario if args.family == "random" else perturbed_tiny
    rng = random.Random(args.seed)
    print(f"machine: {platform.machine()}, Python {platform.python_version()}, "
          f"date {time.strftime('%Y-%m-%d')}, {args.count} scenarios, seed {args.seed}, "
          f"family {args.family}\n")
    ratios, template_ratios = [], []
    infeasible = unproven = 0
    while len(ratios) < args.count:
        scenario = parse_scenario(draw(rng))
        try:
            proof = plan(scenario, SearchOptions(exact=True))
        except Infeasible:
            infeasible += 1  # no plan exists at all: nothing to compare
            continue
        except TooLargeForExact:
            unproven += 1
            continue
        if proof.status is not PlanStatus.OPTIMAL:
            unproven += 1  # the enumeration ran out of time: no optimum to compare with
            continue
        exact = proof.evaluation.samples_per_s
        found = []
        for small in (True, False):
            try:
                found.append(plan(scenario, SearchOptions(
                    time_limit_s=args.time_limit, enumerate_small=small)
                ).evaluation.samples_per_s or 0.0)
            except Infeasible:
                found.append(0.0)  # the search missed every valid plan
        assert exact is not None
        ratios.append(found[0] / exact)
        template_ratios.append(found[1] / exact)
    for name, values in (("default search", ratios),
                         ("templates and allocation only (enumerate_small=False)", template_ratios)):
        within = sum(r >= 0.99 for r in values)
        print(f"{name} / optimum: min {min(values):.4f}, mean {sum(values) / len(values):.4f}; "
              f"within 1% on {within} of {len(values)}")
    print(f"({infeasible} drawn scenarios had no plan; {unproven} were too large for exact "
          "mode or not proven within its time limit)")
    if max(ratios + template_ratios) > 1 + 1e-9:
        raise SystemExit("the heuristic beat the proven optimum: exact mode is wrong")


if __name__ == "__main__":
    main()
