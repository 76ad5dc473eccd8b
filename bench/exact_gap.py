"""The default search, and its templates and allocation alone, against the proven optimum
(exact mode, an enumeration independent of both) on small random scenarios.

Usage: python bench/exact_gap.py [--count N] [--seed S]
       [--family random|tiny|measured|generated]
       [--time-limit S]
`random`: 2-3 GPUs of two types on two nodes, 2-4 layers, micro-batch sizes 1 and 2, a
batch of 2-8 sequences, random speeds, memory and links. `tiny`: the five tiny scenarios
(6-8 GPUs of two or three types, 6-8 layers) changed at random: the batch halved or
doubled, each type's speed scaled by 0.7-1.4, at times a GPU taken off a node; a stand-in
for held-out scenarios of their family. `measured`: for each of A100-40 and V100-16, one
node of 1, 2 or 4 GPUs or two nodes of 2, from a two-type measured scenario with its real
profiles and links; the model cut to the embedding, the first block, 4-8 more blocks and
the head, each type's memory above the reserve cut in the same proportion as the layers
(so that a layer needs as large a share of a GPU as in the whole model), a batch of 16, 32
or 64. `generated`: the same cuts of the shared generated scenarios (of three or four types,
one node of 1 or 2 GPUs per type). Only scenarios whose optimum exact mode proves within its
time limit are counted.

Beside the search's gap, the optimum against the `per_type` baseline (the best plan of
homogeneous pipelines per GPU type, equal to a brute force over that space by a property
test): how much any plan beyond per-type pipelines gains at all, proven.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import platform
import random
import time
from pathlib import Path

from plan_quality import SETS, geomean, tiny_scenarios

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


@functools.cache
def _mixed(family: str) -> list[Path]:
    """The scenarios of a shared set with more than one GPU type (read once per run)."""
    return [path for path in SETS[family]
            if len(parse_scenario(json.loads(path.read_text())).cluster.gpus_per_type) > 1]


def cut(path: Path, rng: random.Random) -> dict:
    """A node or two of each GPU type of the scenario at `path` (of each type in each zone:
    types sit in zones of their own), its model cut to 4-8 blocks, memory above the
    reserve cut with the layers, a batch of 16, 32 or 64."""
    doc = json.loads(path.read_text())
    whole = parse_scenario(doc)  # a copy: the cut below leaves it whole
    doc["name"] = path.stem
    layers = doc["model"]["layers"]
    blocks = [kind for kind in layers[2:-1] if kind == layers[2]][:rng.randint(4, 8)]
    kept = [*layers[:2], *blocks, layers[-1]]
    fraction = len(kept) / len(layers)
    doc["model"]["layers"] = kept
    for name, gpu_type in doc["gpu_types"].items():
        reserved = whole.reserved_gib(name)
        gpu_type["memory_gib"] = reserved + (gpu_type["memory_gib"] - reserved) * fraction
    first_of_type = {}
    for node in doc["cluster"]["nodes"]:
        first_of_type.setdefault(node["gpu_type"], node)
    # Two types: one node of 1, 2 or 4 GPUs, or two of 2; more types: within exact mode.
    shapes = [(1, 1), (1, 2), (1, 4), (2, 2)] if len(first_of_type) == 2 else [(1, 1), (1, 2)]
    nodes = []
    for node in first_of_type.values():
        copies, gpus = rng.choice(shapes)
        nodes += [dict(node, name=f"{node['name']}-{c}", gpus=gpus) for c in range(copies)]
    doc["cluster"]["nodes"] = nodes
    doc["job"]["global_batch_size"] = rng.choice([16, 32, 64])
    return doc


def measured_cut(rng: random.Random) -> dict:
    return cut(rng.choice(_mixed("measured")), rng)


def generated_cut(rng: random.Random) -> dict:
    return cut(rng.choice(_mixed("generated")), rng)


DRAWS = {"random": random_scenario, "tiny": perturbed_tiny, "measured": measured_cut,
         "generated": generated_cut}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--family", choices=sorted(DRAWS), default="random")
    parser.add_argument("--time-limit", type=float, default=2.0,
                        help="the default search's time limit, its enumeration's included")
    args = parser.parse_args()
    draw = DRAWS[args.family]
    rng = random.Random(args.seed)
    print(f"machine: {platform.machine()}, Python {platform.python_version()}, "
          f"date {time.strftime('%Y-%m-%d')}, {args.count} scenarios, seed {args.seed}, "
          f"family {args.family}\n")
    ratios, template_ratios, over_per_type = [], [], []
    infeasible = unproven = 0
    while len(ratios) < args.count:
        drawn = draw(rng)
        scenario = parse_scenario(drawn)
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
        found, per_type = [], None
        for small in (True, False):
            try:
                result = plan(scenario, SearchOptions(time_limit_s=args.time_limit,
                                                      enumerate_small=small))
            except Infeasible:
                found.append(0.0)  # the search missed every valid plan
                continue
            found.append(result.evaluation.samples_per_s or 0.0)
            per_type = per_type or result.baselines.get("per_type")
        assert exact is not None
        ratios.append(found[0] / exact)
        template_ratios.append(found[1] / exact)
        over_per_type.append(exact / per_type if per_type else math.inf)
        print(f"{drawn.get('name', 'drawn')} {dict(scenario.cluster.gpus_per_type)}, "
              f"{len(scenario.model.layers)} layers, batch "
              f"{scenario.job.global_batch_size}: optimum {exact:.3f}, default {found[0]:.3f}, "
              f"per_type {per_type or 0:.3f}")
    for name, values in (("default search", ratios),
                         ("templates and allocation only (enumerate_small=False)", template_ratios)):
        within = sum(r >= 0.99 for r in values)
        print(f"{name} / optimum: min {min(values):.4f}, mean {sum(values) / len(values):.4f}; "
              f"within 1% on {within} of {len(values)}")
    beyond = [r for r in over_per_type if r != math.inf]
    print(f"optimum / per_type baseline: geometric mean {geomean(beyond):.4f}, max "
          f"{max(beyond, default=math.nan):.4f} over {len(beyond)}; on "
          f"{len(over_per_type) - len(beyond)} more only plans beyond per-type pipelines fit")
    print(f"({infeasible} drawn scenarios had no plan; {unproven} were too large for exact "
          "mode or not proven within its time limit)")
    if max(ratios + template_ratios) > 1 + 1e-9:
        raise SystemExit("the heuristic beat the proven optimum: exact mode is wrong")


if __name__ == "__main__":
    main()
