"""A harsher judge of the search where leaving GPUs idle may win: the plan of part of the
fleet, laid on the whole fleet.

For each input, each GPU type is left out in turn and, on inputs of several zones, each
zone is kept alone (its nodes only, no inter-zone link); with --nodes, instead, one node of
each kind (GPU type, zone, size, interfaces) is left out in turn; that part is planned by the
default search, and its plan, valid on the whole fleet with the rest idle, is judged there. A
part's plan faster than the search's own is a plan the search missed.

Inputs: the shared measured and generated scenarios, then `bench/perturbed.py`'s draws of
each seed given.

Usage: python bench/left_idle.py [--seeds 5,73,2026] [--count 80] [--time-limit S] [--nodes]
Prints a line per input and part that beats the search, then a summary for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time
from collections.abc import Iterator
from typing import Any

from perturbed import laid_down, perturbed
from plan_quality import SETS
from pods import node_kinds

from planner import SearchOptions, evaluate, parse_scenario, plan


def parts(doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(what is kept, the scenario of that part) for each type left out and each zone alone."""
    nodes = doc["cluster"]["nodes"]
    types = sorted({n["gpu_type"] for n in nodes})
    zones = sorted({n.get("zone") or "" for n in nodes})
    if len(types) >= 2:
        for left in types:
            part = json.loads(json.dumps(doc))
            part["cluster"]["nodes"] = [n for n in nodes if n["gpu_type"] != left]
            yield f"without {left}", part
    if len(zones) >= 2:
        for zone in zones:
            part = json.loads(json.dumps(doc))
            part["cluster"]["nodes"] = [n for n in nodes if (n.get("zone") or "") == zone]
            part["cluster"]["inter_zone"] = []
            yield f"zone {zone} alone", part


def less_one_node(doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(what is kept, the scenario of that part) for one node of each kind left out, where
    the kind keeps a node."""
    for kind in node_kinds(doc).values():
        if len(kind) >= 2:
            left = kind[-1]["name"]
            part = json.loads(json.dumps(doc))
            part["cluster"]["nodes"] = [n for n in doc["cluster"]["nodes"] if n["name"] != left]
            yield f"without node {left}", part


def part_rate(doc: dict[str, Any], part: dict[str, Any], time_limit_s: float) -> float:
    """Samples/s on the whole fleet of the part's plan (0 where the part has none)."""
    try:
        found = plan(parse_scenario(part), SearchOptions(time_limit_s=time_limit_s)).plan
    except Exception:  # a part may hold no plan at all (too little memory): not a miss
        return 0.0
    # The part's nodes keep their names on the whole fleet.
    evaluation = evaluate(parse_scenario(doc), laid_down(found, 1, lambda node, _: node))
    return (evaluation.samples_per_s or 0.0) if evaluation.valid else 0.0


def inputs(seeds: list[int], count: int) -> Iterator[tuple[str, dict[str, Any]]]:
    for name in ("measured", "generated"):
        for path in SETS[name]:
            yield path.stem, json.loads(path.read_text())
    for seed in seeds:
        rng = random.Random(seed)
        for k in range(count):
            label, doc = perturbed(rng)
            yield f"seed {seed} #{k} {label}", doc


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", default="5,73,2026")
    parser.add_argument("--count", type=int, default=80)
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--nodes", action="store_true",
                        help="leave one node of each kind out in turn, not types and zones")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, Python {platform.python_version()}, "
          f"date {time.strftime('%Y-%m-%d %H:%M')}, seeds {args.seeds}, {args.count} each\n")
    judged = missed = 0
    worst = 1.0
    for label, doc in inputs([int(s) for s in args.seeds.split(",")], args.count):
        pieces = list(less_one_node(doc) if args.nodes else parts(doc))
        if not pieces:
            continue
        ours = plan(parse_scenario(doc), SearchOptions(time_limit_s=args.time_limit)
                    ).evaluation.samples_per_s or 0.0
        judged += 1
        best, kept = max((part_rate(doc, part, args.time_limit), what) for what, part in pieces)
        if best > ours * 1.0005:
            missed += 1
            worst = min(worst, ours / best)
            print(f"- {label}: {ours:.2f} samples/s; {kept}: {best:.2f} "
                  f"({ours / best:.4f}x)", flush=True)
    print(f"\n{missed} of {judged} inputs where a part's plan beats the search"
          + (f" (lowest {worst:.4f}x)" if missed else ""))


if __name__ == "__main__":
    main()
