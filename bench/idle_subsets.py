"""GPUs left idle when that is faster: the whole fleet's plan against the search's plan for
every proper subset of its GPU types (whole nodes) and of its zones.

    python bench/idle_subsets.py [--time-limit S]

Prints, per shared scenario with two or more types or zones, the whole fleet's samples/s
and every subset planned faster than it (none is the target: leaving those GPUs idle is a
plan the whole fleet's search may return).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from planner import SearchOptions, parse_scenario, plan
from planner.fleet import node_subsets

SHARED = Path(__file__).resolve().parents[2] / "shared" / "scenarios"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--time-limit", type=float, default=10.0)
    args = parser.parse_args()
    options = SearchOptions(time_limit_s=args.time_limit)
    print(f"date {time.strftime('%Y-%m-%d %H:%M')} UTC, time limit {args.time_limit} s\n")
    print("| scenario | whole fleet samples/s | subsets planned | subsets faster than the whole |")
    print("|---|---|---|---|")
    for path in sorted([*SHARED.glob("*.json"), *(SHARED / "measured").glob("*.json")]):
        scenario = parse_scenario(json.loads(path.read_text()))
        subsets = (node_subsets(scenario, lambda node: node.gpu_type)
                   + node_subsets(scenario, lambda node: node.zone or ""))
        if not subsets:
            continue
        whole = plan(scenario, options).evaluation.samples_per_s or 0.0
        faster = []
        for kept, part in subsets:
            rate = plan(part, options).evaluation.samples_per_s or 0.0
            if rate > whole * 1.0005:
                faster.append(f"{'+'.join(kept)} {rate / whole:.3f}x")
        print(f"| {path.stem} | {whole:.2f} | {len(subsets)} | {', '.join(faster) or 'none'} |",
              flush=True)


if __name__ == "__main__":
    main()
