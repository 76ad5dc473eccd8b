"""Plan quality on every shared scenario: hetplan versus the baselines and the bound.

Usage: python bench/plan_quality.py [--time-limit S] [SCENARIO ...]
Prints a Markdown table (samples/s and ratios) for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path

from planner import SearchOptions, parse_scenario, plan

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = sorted((ROOT / "tests" / "data" / "scenarios").glob("*.json")) + sorted(
    (ROOT / "bench" / "scenarios" / "measured").glob("*.json"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenarios", nargs="*", type=Path, default=DEFAULT)
    parser.add_argument("--time-limit", type=float, default=10.0)
    args = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {platform.python_version()}, "
          f"date {time.strftime('%Y-%m-%d')}, time limit {args.time_limit} s\n")
    print("| scenario | GPUs | hetplan samples/s | homogeneous | unaware | per-type | bound | "
          "vs best of hom./unaware | vs best of all three | efficiency | plan s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    mixed_ratios = []
    mixed_all_three = []
    for path in args.scenarios:
        scenario = parse_scenario(json.loads(path.read_text()))
        gpus = sum(n.gpus for n in scenario.cluster.nodes)
        started = time.perf_counter()
        result = plan(scenario, SearchOptions(time_limit_s=args.time_limit))
        wall = time.perf_counter() - started
        ours = result.evaluation.samples_per_s or 0.0
        base = result.baselines
        section5 = max(v for v in (base.get("homogeneous"), base.get("unaware"), 0.0) if v is not None)
        best = max(v for v in [*base.values(), 0.0] if v is not None)
        bound = result.evaluation.compute_bound_iteration_s
        bound_rate = scenario.job.global_batch_size / bound if bound else math.nan
        if len({n.gpu_type for n in scenario.cluster.nodes}) > 1 and section5 > 0:
            mixed_ratios.append(ours / section5)
            mixed_all_three.append(ours / best)
        fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        print(f"| {path.stem} | {gpus} | {ours:.2f} | {fmt(base.get('homogeneous'))} | "
              f"{fmt(base.get('unaware'))} | {fmt(base.get('per_type'))} | {bound_rate:.2f} | "
              f"{ours / section5:.3f}x | {ours / best:.3f}x | "
              f"{result.evaluation.efficiency or 0:.3f} | {wall:.2f} |", flush=True)
    if mixed_ratios:
        print(f"\ngeometric mean over {len(mixed_ratios)} mixed-GPU scenarios: hetplan / best "
              f"section-5 baseline {_geomean(mixed_ratios):.3f}x; hetplan / best of all three "
              f"baselines (per-type included) {_geomean(mixed_all_three):.3f}x")


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


if __name__ == "__main__":
    main()
