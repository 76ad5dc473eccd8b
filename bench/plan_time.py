"""Planning time and peak memory against cluster size.

Scales shared scenarios by adding nodes (same types and zones, same shape),
then times `plan` in fresh processes (the best and the median of --repeats
runs: this VM's speed drifts by 20-40% from minute to minute) and reads the
peak RSS (the search's forked child's added). Each process also reports how long
`import planner` took, which a one-shot CLI run pays on top and a running service
pays once.
With --schedules 1f1b,interleaved-1f1b --recompute the searches may also choose
interleaving and recomputation (issue: planning time with the extra schedules allowed).
Usage: python bench/plan_time.py [--sizes 64,512,4096,8192] [--time-limit S] [--repeats N]
       [--schedules LIST] [--recompute] [--local] [--layers N]
With --local every input is planned as a local-learning job (`job.schedule` local); with
--layers N every model is given N layers (its commonest kind repeated), for the time the
search's untimed steps take against model size (`api/solving.py`'s hard deadline).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "tests" / "data" / "scenarios"
BASES = [
    "l40sx16-a40x8-v32x16-t4x8-gpt2.7b",   # 4 types, 34 layers
    "h200x8-h100x16-a80x16-llama13b",      # 3 types, 42 layers
    WIDE := "wide-6types-130layers",       # derived below: 6 types, 130 layers
]


def wide_scenario() -> dict:
    """The 4-type GPT-2.7B scenario with 128 blocks and two more GPU types whose rows are
    scaled from existing ones (a synthetic stress input, not a real cluster)."""
    doc = json.loads((SCENARIOS / "l40sx16-a40x8-v32x16-t4x8-gpt2.7b.json").read_text())
    doc["model"]["layers"] = ["embedding"] + ["block"] * 128 + ["head"]
    derived = {"H100-80G": ("L40S-48G", 0.45, 80), "A10-24G": ("A100-40G", 1.9, 24)}
    for name, (source, factor, memory) in derived.items():
        doc["gpu_types"][name] = dict(doc["gpu_types"][source], memory_gib=memory)
        doc["cluster"]["intra_node"][name] = doc["cluster"]["intra_node"][source]
        doc["profiles"] += [dict(row, gpu_type=name, forward_ms=row["forward_ms"] * factor,
                                 backward_ms=row["backward_ms"] * factor)
                            for row in doc["profiles"] if row["gpu_type"] == source]
        doc["cluster"]["nodes"] += [{"name": f"{name.lower()}-{i}", "gpu_type": name, "gpus": 8}
                                    for i in range(2)]
    return doc


def scaled(name: str, total_gpus: int) -> dict:
    doc = wide_scenario() if name == WIDE else json.loads((SCENARIOS / f"{name}.json").read_text())
    nodes = doc["cluster"]["nodes"]
    have = sum(n["gpus"] for n in nodes)
    copies = max(1, round(total_gpus / have))
    doc["cluster"]["nodes"] = [
        dict(n, name=f"{n['name']}-r{r}") for r in range(copies) for n in nodes]
    # About two sequences per GPU (a power of two), as large runs use: 16k at 8k GPUs.
    gpus = have * copies
    batch = doc["job"]["global_batch_size"]
    while batch < 2 * gpus:
        batch *= 2
    doc["job"]["global_batch_size"] = batch
    return doc


def with_layers(doc: dict, count: int) -> dict:
    """The model's first and last layers with `count - 2` of its commonest kind between."""
    layers = doc["model"]["layers"]
    middle = max(set(layers[1:-1]), key=layers[1:-1].count)
    doc["model"]["layers"] = [layers[0]] + [middle] * (count - 2) + [layers[-1]]
    return doc


def child(name: str, size: int, time_limit: float, schedules: str | None,
          recompute: bool, local: bool, layers: int | None) -> None:
    started = time.perf_counter()
    from planner import SearchOptions, parse_scenario, plan
    from planner.documents import Schedule

    import_s = time.perf_counter() - started
    doc = scaled(name, size)
    if layers is not None:
        doc = with_layers(doc, layers)
    if local:
        sys.path.insert(0, str(ROOT))
        from bench.schedules import with_local_head

        doc = with_local_head(doc)
    scenario = parse_scenario(doc)
    allowed = () if schedules is None else tuple(Schedule(s) for s in schedules.split(","))
    started = time.perf_counter()
    result = plan(scenario, SearchOptions(time_limit_s=time_limit, schedules=allowed,
                                          recompute=recompute))
    wall = time.perf_counter() - started
    # The search may fork a child for its per-type baseline: both peaks added (pages the
    # two share are counted twice, so this overstates what the machine held).
    peak_mib = sum(resource.getrusage(who).ru_maxrss
                   for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)) / 1024
    gpus = scenario.cluster.num_gpus
    print(json.dumps({"scenario": name, "gpus": gpus, "wall_s": wall, "import_s": import_s,
                      "peak_mib": peak_mib,
                      "samples_per_s": result.evaluation.samples_per_s,
                      "layers": len(scenario.model.layers),
                      "types": len(scenario.gpu_types)}))


def speed_index() -> float:
    """Seconds of a fixed pure-Python loop: how fast this machine runs right now."""
    started = time.perf_counter()
    total = 0
    for i in range(3_000_000):
        total += i * i
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="64,512,4096,8192")
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bases", default=",".join(BASES))
    parser.add_argument("--schedules", default=None,
                        help="schedules the search may choose, comma-separated")
    parser.add_argument("--recompute", action="store_true")
    parser.add_argument("--local", action="store_true",
                        help="plan each input as a local-learning job (its head derived as "
                             "bench/schedules.py derives it)")
    parser.add_argument("--layers", type=int, default=None,
                        help="give each input's model this many layers (its commonest kind "
                             "repeated between the first and the last)")
    parser.add_argument("--child", nargs=2)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), args.time_limit, args.schedules,
              args.recompute, args.local, args.layers)
        return
    extra = ([] if args.schedules is None else ["--schedules", args.schedules]) + (
        ["--recompute"] if args.recompute else []) + (["--local"] if args.local else []) + (
        [] if args.layers is None else ["--layers", str(args.layers)])
    print(f"machine: {platform.machine()}, Python {platform.python_version()}, "
          f"date {time.strftime('%Y-%m-%d')}, time limit {args.time_limit} s, "
          f"{args.repeats} fresh processes per row, speed index {speed_index():.2f} s, "
          f"schedules {args.schedules or 'of the job'}{', recompute' if args.recompute else ''}"
          f"{', local-learning jobs' if args.local else ''}\n")
    print("| base scenario | types | layers | GPUs | plan s (best) | plan s (median) | "
          "import s | peak RSS MiB | samples/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.bases.split(","):
        for size in [int(s) for s in args.sizes.split(",")]:
            runs = []
            for _ in range(args.repeats):
                out = subprocess.run([sys.executable, __file__, "--child", name, str(size),
                                      "--time-limit", str(args.time_limit), *extra],
                                     capture_output=True, text=True, timeout=1800)
                if out.returncode != 0:
                    print(f"| {name} | | | {size} | failed: {out.stderr.strip()[-200:]} | | | | |")
                    break
                runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            if not runs:
                continue
            walls = sorted(r["wall_s"] for r in runs)
            r = runs[0]
            print(f"| {name} | {r['types']} | {r['layers']} | {r['gpus']} | {walls[0]:.2f} | "
                  f"{walls[len(walls) // 2]:.2f} | {min(x['import_s'] for x in runs):.2f} | "
                  f"{max(x['peak_mib'] for x in runs):.0f} | {r['samples_per_s']:.1f} |",
                  flush=True)
    print(f"\nspeed index after the runs: {speed_index():.2f} s")


if __name__ == "__main__":
    main()
