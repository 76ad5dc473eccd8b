"""What a one-grid launcher costs: the best plan Megatron-LM, DeepSpeed and torchtitan can
run (`SearchOptions.launcher`) against the best plan, on every shared scenario.

Usage: python bench/launcher_cost.py [--time-limit S]
Prints a Markdown table for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

from planner import PlannerError, SearchOptions, parse_scenario, plan

ROOT = Path(__file__).resolve().parent.parent
LAUNCHERS = ("megatron", "deepspeed", "torchtitan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--time-limit", type=float, default=10.0)
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, Python {platform.python_version()}, "
          f"date {time.strftime('%Y-%m-%d %H:%M')}, time limit {args.time_limit} s\n")
    print("| scenario | best plan samples/s | " + " | ".join(
        f"{name} samples/s (share of best)" for name in LAUNCHERS) + " |")
    print("|---|---|" + "---|" * len(LAUNCHERS))
    for path in sorted((ROOT / "tests" / "data" / "scenarios").glob("*.json")):
        scenario = parse_scenario(json.loads(path.read_text()))
        best = plan(scenario, SearchOptions(time_limit_s=args.time_limit)).evaluation
        cells = []
        for name in LAUNCHERS:
            try:
                found = plan(scenario, SearchOptions(time_limit_s=args.time_limit, launcher=name))
                rate = found.evaluation.samples_per_s or 0.0
                cells.append(f"{rate:.2f} ({rate / (best.samples_per_s or 1):.3f})")
            except PlannerError as error:
                cells.append(f"none: {str(error)[:60]}")
        print(f"| {path.stem} | {best.samples_per_s:.2f} | " + " | ".join(cells) + " |",
              flush=True)


if __name__ == "__main__":
    main()
