"""GPUs left idle when that is faster: the whole fleet's plan against the search's plan for
every proper subset of its GPU types (whole nodes) and of its zones.

    python bench/idle_subsets.py [--time-limit S]

Prints, per shared scenario with two or more types or zones, the whole fleet's samples/s
and every subset planned faster than it (none is the target: leaving those GPUs idle is a
plan the whole fleet's search may return).
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path
from typing import Any

from planner import SearchOptions, parse_scenario, plan

SHARED = Path(__file__).resolve().parents[2] / "shared" / "scenarios"


def parts(doc: dict[str, Any], field: str) -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    values = sorted({n.get(field) or "" for n in doc["cluster"]["nodes"]})
    out = []
    for count in range(1, len(values)):
        for kept in itertools.combinations(values, count):
            part = json.loads(json.dumps(doc))
            part["cluster"]["nodes"] = [n for n in doc["cluster"]["nodes"]
                                        if (n.get(field) or "") in kept]
            zones = {n.get("zone") for n in part["cluster"]["nodes"]}
            if "inter_zone" in doc["cluster"]:
                part["cluster"]["inter_zone"] = [z for z in doc["cluster"]["inter_zone"]
                                                 if set(z["zones"]) <= zones]
            out.append((kept, part))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--time-limit", type=float, default=10.0)
    args = parser.parse_args()
    options = SearchOptions(time_limit_s=args.time_limit)
    print(f"date {time.strftime('%Y-%m-%d %H:%M')} UTC, time limit {args.time_limit} s\n")
    print("| scenario | whole fleet samples/s | subsets planned | subsets faster than the whole |")
    print("|---|---|---|---|")
    for path in sorted([*SHARED.glob("*.json"), *(SHARED / "measured").glob("*.json")]):
        doc = json.loads(path.read_text())
        subsets = parts(doc, "gpu_type") + parts(doc, "zone")
        if not subsets:
            continue
        whole = plan(parse_scenario(doc), options).evaluation.samples_per_s or 0.0
        faster = []
        for kept, part in subsets:
            rate = plan(parse_scenario(part), options).evaluation.samples_per_s or 0.0
            if rate > whole * 1.0005:
                faster.append(f"{'+'.join(kept)} {rate / whole:.3f}x")
        print(f"| {path.stem} | {whole:.2f} | {len(subsets)} | {', '.join(faster) or 'none'} |",
              flush=True)


if __name__ == "__main__":
    main()
