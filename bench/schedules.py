"""Best plans under 1F1B only, with interleaving and recomputation allowed, and with local
learning; planning time at scale with the extra schedules; local against 1F1B on 4 GPUs.

For each scenario of tests/data/scenarios: samples/s, the least memory headroom over all
stages (GiB), and planning time, for (a) the job's 1F1B only, (b) schedules
1f1b + interleaved-1f1b with recomputation, (c) the same scenario with `job.schedule`
`local` (tests/data/reference/NAME.local.json where it exists, otherwise a head kind
added by the rule those vectors state: params 2 * hidden^2, hidden = isqrt(block params /
12), a row wherever the repeated block kind has one at 15% of its time and 10% of its
activation bytes). Then planning time of (a), (b) and (c) on scenarios scaled to --sizes
GPUs (in this process, one after the other), and the ratio local / 1F1B for one 4-stage
pipeline on 4 GPUs (PPLL's setting).
Usage: python bench/schedules.py [--time-limit S] [--sizes 512] [--scenarios DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.plan_time import BASES, scaled  # noqa: E402
from planner import SearchOptions, evaluate, parse_plan, parse_scenario, plan  # noqa: E402
from planner.documents import Schedule  # noqa: E402
from planner.estimate import Evaluation  # noqa: E402

SCENARIOS = ROOT / "tests" / "data" / "scenarios"
REFERENCE = ROOT / "tests" / "data" / "reference"
WIDENED = {"schedules": (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED_1F1B), "recompute": True}
HEAD = "local_head"


def with_local_head(doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` as a local-learning job, its head derived from the repeated block kind."""
    doc = json.loads(json.dumps(doc))
    block = Counter(doc["model"]["layers"]).most_common(1)[0][0]
    hidden = math.isqrt(doc["model"]["kinds"][block]["params"] // 12)
    doc["model"]["kinds"][HEAD] = {"params": 2 * hidden * hidden, "output_bytes_per_sample": 0}
    doc["profiles"] += [dict(row, kind=HEAD, forward_ms=row["forward_ms"] * 0.15,
                             backward_ms=row["backward_ms"] * 0.15,
                             activation_bytes=row["activation_bytes"] * 0.1)
                        for row in doc["profiles"] if row["kind"] == block]
    doc["job"] = dict(doc["job"], schedule="local", local_head_kind=HEAD)
    return doc


def local_document(path: Path) -> tuple[dict[str, Any], str]:
    vector = REFERENCE / f"{path.stem}.local.json"
    if vector.exists():
        return json.loads(vector.read_text()), "vector"
    return with_local_head(json.loads(path.read_text())), "derived"


def headroom_gib(evaluation: Evaluation) -> float:
    return min(s.capacity_gib - s.memory_gib for p in evaluation.pipelines for s in p.stages)


def shape(document: Any) -> str:
    """Schedule, depths, chunks per stage and recomputing stages of a plan, in a few words."""
    depths = sorted({len(p.stages) for p in document.pipelines})
    chunks = sorted({s.num_chunks for p in document.pipelines for s in p.stages})
    recomputing = sum(s.recompute for p in document.pipelines for s in p.stages)
    micro = sorted({p.micro_batch_size for p in document.pipelines})
    return (f"{document.schedule.value}, {len(document.pipelines)} pipelines, depth "
            f"{'/'.join(map(str, depths))}, b {'/'.join(map(str, micro))}, v "
            f"{'/'.join(map(str, chunks))}, {recomputing} recomputing")


def run(doc: dict[str, Any], time_limit: float, **options: Any) -> tuple[float, float, float, str]:
    scenario = parse_scenario(doc)
    started = time.perf_counter()
    result = plan(scenario, SearchOptions(time_limit_s=time_limit, **options))
    wall = time.perf_counter() - started
    assert result.evaluation.samples_per_s is not None
    return (result.evaluation.samples_per_s, headroom_gib(result.evaluation), wall,
            shape(result.plan))


def per_scenario(time_limit: float, folder: Path) -> None:
    print("| scenario | 1f1b samples/s | headroom GiB | plan s | +interleaved+recompute "
          "samples/s | gain | headroom GiB | plan s | local samples/s | vs 1f1b | headroom GiB "
          "| plan s | head |")
    print("|---|" + "---:|" * 12 + "---|")
    shapes = []
    for path in sorted(folder.glob("*.json")):
        doc = json.loads(path.read_text())
        one = run(doc, time_limit)
        wide = run(doc, time_limit, **WIDENED)
        local_doc, head = local_document(path)
        local = run(local_doc, time_limit)
        print(f"| {path.stem} | {one[0]:.2f} | {one[1]:.1f} | {one[2]:.2f} | {wide[0]:.2f} | "
              f"{wide[0] / one[0]:.3f}x | {wide[1]:.1f} | {wide[2]:.2f} | {local[0]:.2f} | "
              f"{local[0] / one[0]:.3f}x | {local[1]:.1f} | {local[2]:.2f} | {head} |", flush=True)
        shapes.append((path.stem, one[3], wide[3], local[3]))
    print("\n| scenario | 1f1b plan | widened plan | local plan |\n|---|---|---|---|")
    for row in shapes:
        print("| " + " | ".join(row) + " |")


def at_scale(sizes: list[int], time_limit: float) -> None:
    print("\n| scenario | GPUs | 1f1b plan s | widened plan s | local plan s | 1f1b samples/s | "
          "widened samples/s | local samples/s |\n|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in BASES:
        for size in sizes:
            doc = scaled(name, size)
            one = run(doc, time_limit)
            wide = run(doc, time_limit, **WIDENED)
            local = run(with_local_head(doc), time_limit)
            gpus = sum(n["gpus"] for n in doc["cluster"]["nodes"])
            print(f"| {name} | {gpus} | {one[2]:.2f} | {wide[2]:.2f} | {local[2]:.2f} | "
                  f"{one[0]:.1f} | {wide[0]:.1f} | {local[0]:.1f} |", flush=True)


def four_stage_ratio(time_limit: float) -> None:
    """One pipeline of 4 stages on 4 A100-80G (the GPT-1.3B scenario's model and rows, its
    local head from the vectors), layers split evenly, both schedules judged on the same
    plan; and each schedule's best plan on those 4 GPUs."""
    doc = json.loads((REFERENCE / "a80x16-v32x16-gpt1.3b.local.json").read_text())
    doc["cluster"]["nodes"] = [n for n in doc["cluster"]["nodes"]
                               if n["gpu_type"] == "A100-80G"][:1]
    doc["cluster"]["nodes"][0] = dict(doc["cluster"]["nodes"][0], gpus=4)
    node = doc["cluster"]["nodes"][0]["name"]
    num_layers = len(doc["model"]["layers"])
    bounds = [round(s * num_layers / 4) for s in range(5)]
    print("\n| global batch | micro-batches | 1f1b samples/s | local samples/s | local / 1f1b "
          "(same 4-stage split) | best 1f1b | best local | best local / best 1f1b |\n"
          "|---:|---:|---:|---:|---:|---:|---:|---:|")
    for batch in (8, 32, 128):
        doc["job"] = dict(doc["job"], global_batch_size=batch)
        local = parse_scenario(doc)
        end_to_end = parse_scenario(dict(doc, job=dict(doc["job"], schedule="1f1b")))
        rates = {}
        for schedule, scenario in (("1f1b", end_to_end), ("local", local)):
            document = parse_plan({"format": "hetplan-plan/1", "schedule": schedule,
                                   "pipelines": [{
                                       "micro_batch_size": 1, "num_micro_batches": batch,
                                       "stages": [{"gpu_type": "A100-80G", "tp": 1,
                                                   "gpus": [f"{node}:{s}"],
                                                   "layers": [bounds[s], bounds[s + 1]]}
                                                  for s in range(4)]}]})
            evaluation = evaluate(scenario, document)
            assert evaluation.valid, evaluation.errors
            rates[schedule] = evaluation.samples_per_s or math.nan
        best_1f1b = run(dict(doc, job=dict(doc["job"], schedule="1f1b")), time_limit)
        best_local = run(doc, time_limit)
        print(f"| {batch} | {batch} | {rates['1f1b']:.2f} | {rates['local']:.2f} | "
              f"{rates['local'] / rates['1f1b']:.3f}x | {best_1f1b[0]:.2f} | {best_local[0]:.2f} "
              f"| {best_local[0] / best_1f1b[0]:.3f}x |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--sizes", default="512")
    parser.add_argument("--skip", default="", help="comma-separated: scenarios,scale,ppll")
    parser.add_argument("--scenarios", type=Path, default=SCENARIOS,
                        help="folder of scenarios planned three ways (default: the shared "
                             "generated ones in tests/data/scenarios; the measured ones are in "
                             "../shared/scenarios/measured)")
    args = parser.parse_args()
    skip = set(args.skip.split(","))
    if "scenarios" not in skip:
        per_scenario(args.time_limit, args.scenarios)
    if "scale" not in skip:
        at_scale([int(s) for s in args.sizes.split(",")], args.time_limit)
    if "ppll" not in skip:
        four_stage_ratio(args.time_limit)


if __name__ == "__main__":
    main()
