"""Which launcher formats can express hetplan's plan of each shared scenario.

Usage: python bench/export_coverage.py [--time-limit S] [SCENARIO ...]
Plans each scenario with the current search, then asks every export format (with the
scenario's layer kinds, schedule and ZeRO stage) whether it can run the plan. Prints a
Markdown table for BENCHMARKS.md, and each refusal's first reason below it.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

from planner import SearchOptions, parse_scenario, plan
from planner.export import FORMATS, expressible, format_options, scenario_options

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = sorted((ROOT / "tests" / "data" / "scenarios").glob("*.json"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenarios", nargs="*", type=Path, default=DEFAULT)
    parser.add_argument("--time-limit", type=float, default=5.0)
    args = parser.parse_args()
    formats = sorted(FORMATS)
    print(f"machine: {platform.processor() or platform.machine()}, {platform.python_version()}, "
          f"date {time.strftime('%Y-%m-%d')}, time limit {args.time_limit} s\n")
    print("| scenario | pipelines | " + " | ".join(formats) + " |")
    print("|---|---|" + "---|" * len(formats))
    refusals = []
    for path in args.scenarios:
        scenario = parse_scenario(json.loads(path.read_text()))
        found = plan(scenario, SearchOptions(time_limit_s=args.time_limit)).plan
        marks = []
        for fmt in formats:
            options = {k: v for k, v in scenario_options(scenario).items()
                       if k in format_options(fmt)}
            reasons = expressible(found, fmt, **options)
            marks.append("yes" if reasons is None else "no")
            if reasons is not None:
                refusals.append(f"- {path.stem}, {fmt}: {reasons.splitlines()[0]}")
        print(f"| {path.stem} | {len(found.pipelines)} | " + " | ".join(marks) + " |",
              flush=True)
    print("\nFirst reason of each refusal:\n")
    print("\n".join(refusals))


if __name__ == "__main__":
    main()
