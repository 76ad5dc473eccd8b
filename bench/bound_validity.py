"""The upper bound (`planner/space_bound.py`) against proven optima of random small scenarios.

An upper bound is only worth reporting if no plan beats it: exact mode proves each random
scenario's optimum, and the bound must be at least that. Also prints how close it is.
Scenarios come from the test suite's generators: `tiny` (2-3 GPUs, as
`test_no_optimum_beats_the_upper_bound`) and `four` (4 GPUs with 2-GPU nodes and links
between nodes down to 0.1 GB/s, where rings kept inside nodes compete with crossings).

Usage: python bench/bound_validity.py [--kind tiny|four] [--count N] [--seed S]
Exits 1 if any optimum beats its bound.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, seed, settings

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner import parse_scenario  # noqa: E402
from planner.search.exact import exact_optimum  # noqa: E402
from planner.space_bound import space_bound  # noqa: E402
from tests.planner.test_exact import random_four_gpus, random_tiny  # noqa: E402

KINDS = {"tiny": random_tiny, "four": random_four_gpus}
EXACT_LIMIT_S = 20.0
"""An enumeration that takes longer is left out (counted, not checked)."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", choices=sorted(KINDS), default="tiny")
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    ratios: list[float] = []
    violations: list[tuple[float, float]] = []
    counts = {"scenarios": 0, "no plan": 0, "not proven in time": 0}

    @seed(args.seed)
    @settings(max_examples=args.count, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(KINDS[args.kind]())
    def check(doc: dict[str, Any]) -> None:
        counts["scenarios"] += 1
        scenario = parse_scenario(doc)
        found = exact_optimum(scenario, deadline=time.monotonic() + EXACT_LIMIT_S)
        if found is None or not found.evaluation.samples_per_s:
            counts["no plan"] += 1
            return
        if not found.proven:
            counts["not proven in time"] += 1
            return
        bound = space_bound(scenario)
        optimum = found.evaluation.samples_per_s
        if bound is None or optimum > bound.samples_per_s:
            violations.append((optimum, bound.samples_per_s if bound else 0.0))
            return
        ratios.append(bound.samples_per_s / optimum)

    started = time.monotonic()
    check()
    print(f"machine: {platform.machine()}, Python {platform.python_version()}, "
          f"date {time.strftime('%Y-%m-%d %H:%M')}, kind {args.kind}, seed {args.seed}, "
          f"{time.monotonic() - started:.0f} s")
    print(f"{counts['scenarios']} scenarios: {len(ratios) + len(violations)} proven optima "
          f"checked, {counts['no plan']} with no valid plan, "
          f"{counts['not proven in time']} not proven within {EXACT_LIMIT_S:g} s")
    print(f"optima above their bound: {len(violations)} {violations[:5]}")
    if ratios:
        ordered = sorted(ratios)
        print(f"bound / optimum: min {ordered[0]:.4f}, median {statistics.median(ordered):.4f}, "
              f"max {ordered[-1]:.4f}; within 5%: {sum(r <= 1.05 for r in ordered)}, "
              f"within 20%: {sum(r <= 1.2 for r in ordered)}")
    sys.exit(1 if violations else 0)


if __name__ == "__main__":
    main()
