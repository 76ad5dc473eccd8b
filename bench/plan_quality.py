"""Plan quality: hetplan against the per-type reference, the baselines, the bounds and
the known optima of the tiny scenarios.

Usage: python bench/plan_quality.py [--time-limit S] [--sets measured,generated,tiny]
Prints Markdown tables for BENCHMARKS.md:
- measured and generated scenarios: hetplan's samples/s against the per-type
  reference plan (bench/reference/per-type, evaluated here), the best of the
  three baselines (the reference counted as a fourth where it is higher), the
  compute bound and the upper bound of plan.search;
- tiny scenarios: the default search and exact mode against the known optimum.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path

from planner import SearchOptions, evaluate, parse_plan, parse_scenario, plan

ROOT = Path(__file__).resolve().parent.parent
SETS = {
    "measured": sorted((ROOT / "bench" / "scenarios" / "measured").glob("*.json")),
    "generated": sorted((ROOT / "tests" / "data" / "scenarios").glob("*.json")),
}
REFERENCE = ROOT / "bench" / "reference" / "per-type"
TINY = ROOT / "tests" / "data" / "tiny"


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def quality_table(name: str, paths: list[Path], time_limit: float) -> None:
    print(f"\n### {name} scenarios\n")
    print("| scenario | GPUs | hetplan samples/s | per-type reference | vs reference | "
          "best baseline | vs best of baselines and reference | compute bound | upper bound | "
          "gap to upper bound | status | plan s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    mixed_vs_ref, mixed_vs_best, all_vs_ref = [], [], []
    for path in paths:
        scenario = parse_scenario(json.loads(path.read_text()))
        gpus = scenario.cluster.num_gpus
        reference = evaluate(scenario, parse_plan(json.loads(
            (REFERENCE / f"{path.stem}.plan.json").read_text())))
        ref = reference.samples_per_s if reference.valid else None
        started = time.perf_counter()
        result = plan(scenario, SearchOptions(time_limit_s=time_limit))
        wall = time.perf_counter() - started
        ours = result.evaluation.samples_per_s or 0.0
        baselines = max((v for v in result.baselines.values() if v is not None), default=0.0)
        best = max(baselines, ref or 0.0)
        search = result.plan.search or {}
        compute = scenario.job.global_batch_size / result.evaluation.compute_bound_iteration_s \
            if result.evaluation.compute_bound_iteration_s else math.nan
        upper = search.get("upper_bound_samples_per_s") or math.nan
        if ref:
            all_vs_ref.append(ours / ref)
        if len({n.gpu_type for n in scenario.cluster.nodes}) > 1:
            if ref:
                mixed_vs_ref.append(ours / ref)
            mixed_vs_best.append(ours / best)
        print(f"| {path.stem} | {gpus} | {ours:.2f} | {ref or 0:.2f} | "
              f"{ours / ref if ref else math.nan:.3f}x | {baselines:.2f} | {ours / best:.3f}x | "
              f"{compute:.2f} | {upper:.2f} | {1 - ours / upper:.3f} | {result.status.value} | "
              f"{wall:.2f} |", flush=True)
    print(f"\n{name}: geometric mean over {len(mixed_vs_ref)} mixed-GPU scenarios "
          f"{geomean(mixed_vs_ref):.3f}x the per-type reference (lowest of all "
          f"{len(all_vs_ref)}: {min(all_vs_ref, default=math.nan):.3f}x); "
          f"{geomean(mixed_vs_best):.3f}x the best of the baselines and the reference "
          f"(lowest {min(mixed_vs_best, default=math.nan):.3f}x)")


def tiny_scenarios() -> list[Path]:
    """The tiny scenarios' files, without their optima."""
    return sorted(p for p in TINY.glob("tiny-*.json") if not p.stem.endswith(".optimum"))


def tiny_table(time_limit: float) -> None:
    print("\n### tiny scenarios (known optima)\n")
    print("| scenario | optimum samples/s | default search | default / optimum | default s | "
          "exact mode | exact / optimum | exact status | exact s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for path in tiny_scenarios():
        scenario = parse_scenario(json.loads(path.read_text()))
        optimum = json.loads((TINY / f"{path.stem}.optimum.json").read_text())["samples_per_s"]
        started = time.perf_counter()
        default = plan(scenario, SearchOptions(time_limit_s=time_limit))
        default_s = time.perf_counter() - started
        started = time.perf_counter()
        exact = plan(scenario, SearchOptions(time_limit_s=max(time_limit, 300), exact=True))
        exact_s = time.perf_counter() - started
        d = default.evaluation.samples_per_s or 0.0
        e = exact.evaluation.samples_per_s or 0.0
        print(f"| {path.stem} | {optimum:.3f} | {d:.3f} | {d / optimum:.4f} | {default_s:.2f} | "
              f"{e:.3f} | {e / optimum:.6f} | {exact.status.value} | {exact_s:.2f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--sets", default="measured,generated,tiny")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, Python {platform.python_version()}, "
          f"date {time.strftime('%Y-%m-%d %H:%M')}, time limit {args.time_limit} s")
    for name in args.sets.split(","):
        if name == "tiny":
            tiny_table(args.time_limit)
        else:
            quality_table(name, SETS[name], args.time_limit)


if __name__ == "__main__":
    main()
