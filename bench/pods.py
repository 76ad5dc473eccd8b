"""A harsher judge of the search on fleets built of repeated pods: the plan of one pod,
laid down on every pod.

A fleet whose nodes of each kind (GPU type, zone, GPUs, interfaces) come in counts that
share a divisor k splits into k identical pods; with the batch split k ways too, the pod's
own plan repeated k times is a valid plan of the whole fleet, and the one an engineer who
plans a pod and repeats it would run. Here every such k is tried on each input: the pod
(the first 1/k of each kind's nodes) is planned by the default search, its plan tiled over
the k pods and judged on the whole fleet. A tiled plan faster than the search's own is a
plan the search missed.

Usage: python bench/pods.py [--sets measured,generated] [--time-limit S]
       [--perturbed N --seed S --family F]
With --perturbed, `bench/perturbed.py`'s first N inputs of that seed and family are judged
too (the shared sets left out with `--sets ""`). Prints a Markdown table for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from perturbed import FAMILIES, laid_down, perturbed
from plan_quality import SETS

from planner import SearchOptions, evaluate, parse_scenario, plan


def node_kinds(doc: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The scenario's nodes grouped by everything but their name."""
    kinds: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for node in doc["cluster"]["nodes"]:
        kinds[json.dumps({k: v for k, v in node.items() if k != "name"}, sort_keys=True)].append(node)
    return kinds


def pod_counts(doc: dict[str, Any]) -> list[int]:
    """Every k > 1 that splits each kind of node and the batch k ways."""
    shared = math.gcd(*(len(nodes) for nodes in node_kinds(doc).values()))
    batch = doc["job"]["global_batch_size"]
    return [k for k in range(2, shared + 1) if shared % k == 0 and batch % k == 0]


def tiled_rate(doc: dict[str, Any], pods: int, time_limit_s: float) -> float:
    """Samples/s on the whole fleet of one pod's plan laid down on each of `pods` pods."""
    kinds = node_kinds(doc)
    pod = json.loads(json.dumps(doc))
    pod["cluster"]["nodes"] = [n for nodes in kinds.values() for n in nodes[:len(nodes) // pods]]
    pod["job"]["global_batch_size"] //= pods
    small = plan(parse_scenario(pod), SearchOptions(time_limit_s=time_limit_s)).plan
    per_pod = {key: len(nodes) // pods for key, nodes in kinds.items()}
    # The pod's i-th node of a kind stands for the copy's i-th node of that kind.
    name_of = [{nodes[i]["name"]: nodes[copy * per_pod[key] + i]["name"]
                for key, nodes in kinds.items() for i in range(per_pod[key])}
               for copy in range(pods)]
    whole = laid_down(small, pods, lambda node, copy: name_of[copy][node])
    return evaluate(parse_scenario(doc), whole).samples_per_s or 0.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sets", default="measured,generated")
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--perturbed", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--family", choices=FAMILIES, default="generated")
    args = parser.parse_args()
    inputs = [(path.stem, json.loads(Path(path).read_text()))
              for name in filter(None, args.sets.split(",")) for path in SETS[name]]
    rng = random.Random(args.seed)
    for k in range(args.perturbed):
        label, doc = perturbed(rng, args.family)
        inputs.append((f"#{k} {label}", doc))
    print(f"machine: {platform.machine()}, Python {platform.python_version()}, "
          f"date {time.strftime('%Y-%m-%d %H:%M')}\n")
    print("| scenario | GPUs | hetplan samples/s | pods tried | best tiled pod plan | pods | "
          "hetplan / best tiled |")
    print("|---|---|---|---|---|---|---|")
    missed = []
    for label, doc in inputs:
        counts = pod_counts(doc)
        scenario = parse_scenario(doc)
        gpus = scenario.cluster.num_gpus
        if not counts:
            print(f"| {label} | {gpus} | | none | | | |", flush=True)
            continue
        ours = plan(scenario, SearchOptions(time_limit_s=args.time_limit)
                    ).evaluation.samples_per_s or 0.0
        rates = {k: tiled_rate(doc, k, args.time_limit) for k in counts}
        pods = max(rates, key=lambda k: rates[k])
        print(f"| {label} | {gpus} | {ours:.2f} | {', '.join(map(str, counts))} | "
              f"{rates[pods]:.2f} | {pods} | {ours / rates[pods]:.3f}x |", flush=True)
        if rates[pods] > ours * 1.0005:
            missed.append(f"{label.split(' ')[0]} ({ours / rates[pods]:.3f}x)")
    print(f"\n{len(missed)} inputs where a tiled pod plan beats the search: "
          + (", ".join(missed) or "none"))


if __name__ == "__main__":
    main()
