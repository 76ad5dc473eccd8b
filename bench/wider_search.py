"""Headroom: does a much wider search find faster plans than the default one?

Each input is planned twice: with the defaults, and with the search's limits raised
(`RAISED` below): 32 finalists instead of 8; 6 refined plans instead of 3; 8 judged
candidates per baseline (4) and 4 per family (2); finalists judged up to 1.3 times the best
quick estimate (1.1); 24 grid drafts (6) from 12 swept structures (3), with the full sweep
budget of 2^20 cells on every fleet size; a fourth tp option per class in the grids; 4
points per class for two-segment templates (2); homogeneous depths kept for a 0.5% gain
(2%); 160 templates per knapsack (80); 12 drafts per baseline (6); polishing up to 128
tries (64) with four times the evaluation budget, and no time guard. Where the widened
search finds little, the default search is at the ceiling of its design rather than of
its limits. Each input is planned with the defaults first; the limits are module
constants, raised only while the widened search runs.

Usage: python bench/wider_search.py [--count N] [--time-limit S]
Inputs: the measured and generated shared scenarios, then the first N perturbed ones of
bench/perturbed.py (seed 0).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import platform
import random
import time
from collections.abc import Iterator
from typing import Any
from unittest import mock

from perturbed import perturbed
from plan_quality import SETS, geomean

from planner import SearchOptions, parse_scenario, plan
from planner.search import allocate, baselines, grids, judging, polish, templates

RAISED: list[tuple[object, str, object]] = [
    (judging, "REFINED", 6), (judging, "BASELINE_FINALISTS", 8),
    (judging, "FAMILY_FINALISTS", 4), (judging, "QUICK_SLACK", 1.3),
    (judging, "POLISH_SHARE", 5.0),
    (grids, "KEPT", 24), (grids, "SWEPT", 12), (grids, "SWEPT_CELLS", 1 << 20),
    (grids, "SWEPT_CELLS_FULL_UP_TO", 10**6), (grids, "TP_PER_CLASS", 4),
    (templates, "IMPROVEMENT", 0.995),
    (templates, "TemplateLimits", functools.partial(templates.TemplateLimits,
                                                    max_points_per_class=4)),
    (allocate, "MODEL_TEMPLATES", 160), (baselines, "KEEP", 12),
    (polish, "MAX_TRIES", 128), (polish, "PIPELINE_EVALUATIONS", 2560),
    (polish, "STAGE_EVALUATIONS", 20000),
]
WIDER_FINALISTS = 32


@contextlib.contextmanager
def widened() -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for module, name, value in RAISED:
            stack.enter_context(mock.patch.object(module, name, value))
        yield


def inputs(count: int) -> Iterator[tuple[str, dict[str, Any]]]:
    for name in ("measured", "generated"):
        for path in SETS[name]:
            yield path.stem, json.loads(path.read_text())
    rng = random.Random(0)
    for k in range(count):
        label, doc = perturbed(rng)
        yield f"perturbed #{k} ({label})", doc


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=60)
    parser.add_argument("--time-limit", type=float, default=10.0)
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, Python {platform.python_version()}, "
          f"date {time.strftime('%Y-%m-%d %H:%M')}\n")
    print("| input | default samples/s | widened samples/s | widened / default |\n"
          "|---|---|---|---|")
    ratios, seconds = [], [0.0, 0.0]
    for label, doc in inputs(args.count):
        scenario = parse_scenario(doc)
        rates = []
        for k, finalists in enumerate((SearchOptions().finalists, WIDER_FINALISTS)):
            started = time.perf_counter()
            with widened() if k else contextlib.nullcontext():
                result = plan(scenario, SearchOptions(time_limit_s=args.time_limit,
                                                      finalists=finalists))
            seconds[k] += time.perf_counter() - started
            rates.append(result.evaluation.samples_per_s or math.nan)
        ratios.append(rates[1] / rates[0])
        if abs(ratios[-1] - 1) > 1e-9:
            print(f"| {label} | {rates[0]:.2f} | {rates[1]:.2f} | {ratios[-1]:.4f} |")
    same = sum(abs(r - 1) <= 1e-9 for r in ratios)
    print(f"\n{len(ratios)} inputs: {same} planned as fast either way (not listed), "
          f"{sum(r > 1 + 1e-9 for r in ratios)} faster widened, "
          f"{sum(r < 1 - 1e-9 for r in ratios)} slower; geometric mean widened / default "
          f"{geomean(ratios):.4f}, best {max(ratios):.4f}, worst {min(ratios):.4f}; "
          f"search seconds in all: default {seconds[0]:.1f}, widened {seconds[1]:.1f}")


if __name__ == "__main__":
    main()
