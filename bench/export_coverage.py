"""Which launcher formats can express hetplan's plan of each shared scenario.

Usage: python bench/export_coverage.py [--time-limit S] [--widened] [SCENARIO ...]
Plans each scenario with the current search, then asks every export format (with the
scenario's layer kinds, schedule and ZeRO stage) whether it can run the plan. Prints a
Markdown table for BENCHMARKS.md, and each refusal's first reason below it. With
--widened the search may also interleave and recompute (schedules 1f1b and
interleaved-1f1b, recompute allowed), and the table says what the plan uses.
With --per-launcher it then plans each scenario again for each framework launcher
(`SearchOptions.launcher`, same schedules) and prints what that plan uses and its speed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import time
from pathlib import Path

from planner import SearchOptions, parse_scenario, plan
from planner.documents import Plan, Schedule
from planner.export import FORMATS, expressible, format_options, scenario_options

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = sorted((ROOT / "tests" / "data" / "scenarios").glob("*.json"))


WIDENED_SCHEDULES = (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED_1F1B)


def uses(found: Plan) -> str:
    """What a plan uses of the version 1.1 schedules: chunks per stage, recomputing stages."""
    chunks = sorted({p.stages[0].num_chunks for p in found.pipelines})
    stages = [s for p in found.pipelines for s in p.stages]
    recompute = sum(s.recompute for s in stages)
    parts = [f"{(found.schedule or Schedule.ONE_F_ONE_B).value}"]
    if chunks != [1]:
        parts.append(f"v {'/'.join(map(str, chunks))}")
    if recompute:
        parts.append(f"recompute {recompute}/{len(stages)} stages")
    return ", ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenarios", nargs="*", type=Path, default=DEFAULT)
    parser.add_argument("--time-limit", type=float, default=5.0)
    parser.add_argument("--widened", action="store_true",
                        help="Allow interleaved-1f1b and recomputation in the search.")
    parser.add_argument("--per-launcher", action="store_true",
                        help="Also plan for each framework launcher and print what it uses.")
    args = parser.parse_args()
    formats = sorted(FORMATS)
    search = SearchOptions(time_limit_s=args.time_limit)
    if args.widened:
        search = dataclasses.replace(search, schedules=WIDENED_SCHEDULES, recompute=True)
    print(f"machine: {platform.processor() or platform.machine()}, {platform.python_version()}, "
          f"date {time.strftime('%Y-%m-%d')}, time limit {args.time_limit} s, "
          f"{'widened' if args.widened else 'default'} schedules\n")
    print("| scenario | pipelines | plan uses | " + " | ".join(formats) + " |")
    print("|---|---|---|" + "---|" * len(formats))
    refusals = []
    for path in args.scenarios:
        scenario = parse_scenario(json.loads(path.read_text()))
        found = plan(scenario, search).plan
        marks = []
        for fmt in formats:
            options = {k: v for k, v in scenario_options(scenario).items()
                       if k in format_options(fmt)}
            reasons = expressible(found, fmt, **options)
            marks.append("yes" if reasons is None else "no")
            if reasons is not None:
                refusals.append(f"- {path.stem}, {fmt}: {reasons.splitlines()[0]}")
        print(f"| {path.stem} | {len(found.pipelines)} | {uses(found)} | " + " | ".join(marks)
              + " |", flush=True)
    print("\nFirst reason of each refusal:\n")
    print("\n".join(refusals))
    if args.per_launcher:
        per_launcher(args.scenarios, search)


FRAMEWORKS = ("pipelining", "megatron", "deepspeed", "torchtitan")


def per_launcher(paths: list[Path], search: SearchOptions) -> None:
    """The best plan each framework runs (a launcher-restricted search): what it uses and
    samples/s."""
    print("\n| scenario | " + " | ".join(FRAMEWORKS) + " |")
    print("|---|" + "---|" * len(FRAMEWORKS))
    for path in paths:
        scenario = parse_scenario(json.loads(path.read_text()))
        cells = []
        for launcher in FRAMEWORKS:
            result = plan(scenario, dataclasses.replace(search, launcher=launcher))
            rate = scenario.job.global_batch_size / (result.evaluation.iteration_s or math.inf)
            cells.append(f"{uses(result.plan)}: {rate:.2f}")
        print(f"| {path.stem} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
