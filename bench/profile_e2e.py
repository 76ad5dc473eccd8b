"""Does a plan's estimate from measured rows match a real timed training step?

For each TP degree, in one group of processes (the main process for TP 1, spawned
gloo/NCCL processes for TP > 1), `--rounds` times:

1. profile the model's layers with hetplan's layer profiler (`profile_points`,
   what `profile_layers` runs on every rank) at the given micro-batch sizes,
   once per `--passes` value (passes per timed repeat);
2. time real training steps of the same layers: `num_micro_batches`
   forward+backward passes through all layers (embedding -> blocks -> head,
   loss.backward()), a barrier before each step.

Profiling and steps alternate every few seconds in the same processes, with the
same threads, so both sample the same conditions of a shared host (another job
that comes and goes, a neighbour on the physical cores slows both alike). Each
round's rows make a scenario and a one-pipeline, one-stage plan holding every
layer; `planner.evaluate` predicts its iteration time. The prediction is the
median of the rounds' predictions, the measurement the median of the rounds'
median steps. The error is the median over rounds of each round's prediction
against the steps timed right after it (the range is printed too), and beside
it the error of the two medians; with the share of the machine's CPU that
other processes used.

Threads: `--threads N` sets N intra-op threads in every process; without it TP 1
uses torch's default and TP n processes split the cores
(`profiles.distributed.threads_per_process`). Profiling and steps run in the
same processes, so they always use the same threads.

    python bench/profile_e2e.py --model tiny-gpt --micro-batches 1,2 --tp 1,2 \
        --num-micro-batches 8 --steps 10 --rounds 8 --repeats 20 --passes 1,8 \
        [--threads 1] [--device cpu|cuda] [--json out.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner import evaluate, parse_plan, parse_scenario  # noqa: E402
from profiles.distributed import DistContext, spawn  # noqa: E402
from profiles.layer_profiler import (  # noqa: E402
    DTYPES,
    LayerProfile,
    ProfileOptions,
    device_name,
    profile_points,
)
from profiles.models import ModelSpec, check_tp, get_preset, layer_kinds  # noqa: E402
from profiles.rows import LayerPoint, kinds_from_rows, merge_ranks  # noqa: E402
from profiles.torch_layers import build_layer  # noqa: E402


def scenario_for(spec: ModelSpec, rows: list[dict[str, Any]], *, gpus: int,
                 batch: int) -> dict[str, Any]:
    return {
        "gpu_types": {"dev": {"memory_gib": 64}},
        "cluster": {"nodes": [{"name": "host", "gpu_type": "dev", "gpus": gpus}],
                    "intra_node": {"dev": {"bandwidth_gb_per_s": 10, "latency_us": 10}},
                    "inter_node": {"bandwidth_gb_per_s": 1, "latency_us": 100}},
        "model": {"name": spec.name, "seq_len": spec.seq_len, "layers": layer_kinds(spec),
                  "kinds": kinds_from_rows(rows)},
        "profiles": rows,
        "job": {"global_batch_size": batch, "reserved_gib": 0},
    }


def one_stage_plan(spec: ModelSpec, *, micro_batch: int, num_micro_batches: int,
                   tp: int) -> dict[str, Any]:
    return {"pipelines": [{"micro_batch_size": micro_batch,
                           "num_micro_batches": num_micro_batches,
                           "stages": [{"gpu_type": "dev", "tp": tp,
                                       "gpus": [f"host:{i}" for i in range(tp)],
                                       "layers": [0, spec.num_layers]}]}]}


def timed_steps(ctx: DistContext | None, spec: ModelSpec, micro_batch: int,
                num_micro_batches: int, steps: int, warmup: int, dtype: str,
                device: str, threads: int | None) -> list[tuple[float, float]]:
    """(wall s, process CPU s) of each real training step (gradient accumulation over the
    micro-batches). CPU time is reported beside wall time because on a shared CPU the wall
    time of a long step includes time the scheduler gave to other processes."""
    rank, size = (ctx.rank, ctx.world_size) if ctx else (0, 1)
    device = ctx.device if ctx else device
    if threads is not None and device == "cpu":
        torch.set_num_threads(threads)
    layers = [build_layer(spec, kind, layer_index=i, tp_rank=rank, tp_size=size,
                          dtype=DTYPES[dtype], device=device)
              for i, kind in enumerate(layer_kinds(spec))]
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, spec.vocab_size, (micro_batch, spec.seq_len), generator=gen)
               .to(device) for _ in range(num_micro_batches)]
    cuda = device.startswith("cuda")
    out = []
    for step in range(warmup + steps):
        if size > 1:
            torch.distributed.barrier()
        if cuda:
            torch.cuda.synchronize()
        start, start_cpu = time.perf_counter(), time.process_time()
        for ids in batches:  # one stage, 1F1B: forward then backward of each micro-batch
            hidden = layers[0](ids)
            for block in layers[1:-1]:
                hidden = block(hidden)
            layers[-1](hidden, ids).backward()
        if cuda:
            torch.cuda.synchronize()
        if step >= warmup:
            out.append((time.perf_counter() - start, time.process_time() - start_cpu))
    return out


Round = tuple[dict[int, list[Any]], dict[int, list[tuple[float, float]]]]
"""One round on one rank: {passes: profile_points' results}, {micro_batch: timed steps}."""


def measure_rounds(ctx: DistContext | None, spec: ModelSpec, options: list[ProfileOptions],
                   micro_batches: tuple[int, ...], num_micro_batches: int, steps: int,
                   rounds: int) -> list[Round]:
    """Profile, then time steps, `rounds` times over, in this process (one TP rank)."""
    tp = ctx.world_size if ctx else 1
    first = options[0]
    out: list[Round] = []
    for _ in range(rounds):
        profiled = {o.passes: profile_points(spec, o, tp=tp, ctx=ctx) for o in options}
        stepped = {b: timed_steps(ctx, spec, b, num_micro_batches, steps, 3, first.dtype_name,
                                  first.device, first.cpu_threads)
                   for b in micro_batches}
        out.append((profiled, stepped))
    return out


def _rank_rounds(ctx: DistContext, *args: Any) -> list[Round]:
    return measure_rounds(ctx, *args)


def merged_rows(spec: ModelSpec, options: ProfileOptions, per_rank: list[list[Any]],
                name: str) -> list[dict[str, Any]]:
    """Rows of one round from every rank's points (the slowest rank counts, as in
    `profile_layers`)."""
    points = []
    for results in zip(*per_rank, strict=True):
        if not all(isinstance(r, LayerPoint) for r in results):
            raise RuntimeError(f"a point was skipped (out of memory): {results}")
        points.append(merge_ranks(results))
    return LayerProfile(spec=spec, options=options, device_name=name, points=points).rows("dev")


def cpu_seconds() -> tuple[float, float, float] | None:
    """(busy, all) CPU seconds of the whole machine since boot (/proc/stat: busy is
    everything but idle and iowait, steal included), and the CPU seconds of this process
    and its reaped children. None where /proc/stat is missing (not Linux)."""
    try:
        with open("/proc/stat", encoding="utf-8") as stat:
            ticks = [int(x) for x in stat.readline().split()[1:9]]
    except OSError:
        return None
    hz = os.sysconf("SC_CLK_TCK")
    own = sum(getattr(resource.getrusage(who), field)
              for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
              for field in ("ru_utime", "ru_stime"))
    idle = ticks[3] + ticks[4]
    return (sum(ticks) - idle) / hz, sum(ticks) / hz, own


def other_load(before: tuple[float, float, float] | None,
               after: tuple[float, float, float] | None) -> float | None:
    """Share of the machine's CPU capacity that other processes used between two readings."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    busy, total, own = (a - b for a, b in zip(after, before, strict=True))
    return min(1.0, max(0.0, (busy - own) / total))


def predict(spec: ModelSpec, rows: list[dict[str, Any]], *, tp: int, micro_batch: int,
            num_micro_batches: int) -> float:
    """`planner.evaluate`'s iteration time of the one-stage plan, from `rows`."""
    scenario = parse_scenario(scenario_for(spec, rows, gpus=tp,
                                           batch=micro_batch * num_micro_batches))
    evaluation = evaluate(scenario, parse_plan(one_stage_plan(
        spec, micro_batch=micro_batch, num_micro_batches=num_micro_batches, tp=tp)))
    assert evaluation.valid and evaluation.iteration_s is not None, evaluation.errors
    return evaluation.iteration_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-gpt")
    parser.add_argument("--micro-batches", default="1,2")
    parser.add_argument("--tp", default="1,2")
    parser.add_argument("--num-micro-batches", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=8,
                        help="profile-then-step rounds, alternating in the same processes")
    parser.add_argument("--repeats", type=int, default=20, help="profiler repeats per round")
    parser.add_argument("--passes", default="8",
                        help="profiler passes per repeat; several values, e.g. 1,8, are each "
                             "profiled every round and get a prediction each")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads per process (profiling and real steps alike)")
    parser.add_argument("--cpu-clock", default="wall", choices=("wall", "process"),
                        help="profile with wall time or process CPU time (TP 1 only)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    spec = get_preset(args.model)
    micro_batches = tuple(int(x) for x in args.micro_batches.split(","))
    tps = tuple(int(x) for x in args.tp.split(","))
    for tp in tps:
        check_tp(spec, tp)
    name = device_name(args.device)
    results: list[dict[str, Any]] = []
    last_rows: dict[int, list[dict[str, Any]]] = {}
    for tp in tps:
        # ProfileOptions rejects cpu_clock "process" with tp > 1.
        options = [ProfileOptions(micro_batches=micro_batches, tp_sizes=(tp,), device=args.device,
                                  warmup=5, repeats=args.repeats, passes=int(passes),
                                  cpu_threads=args.threads, cpu_clock=args.cpu_clock)
                   for passes in args.passes.split(",")]
        before = cpu_seconds()
        rank_args = (spec, options, micro_batches, args.num_micro_batches, args.steps,
                     args.rounds)
        if tp == 1:
            if args.threads is not None and args.device == "cpu":
                torch.set_num_threads(args.threads)
            per_rank = [measure_rounds(None, *rank_args)]
        else:
            per_rank = spawn(_rank_rounds, world_size=tp, device=args.device, args=rank_args)
        load = other_load(before, cpu_seconds())
        # Rows of each round and passes value; the last round's are printed.
        rows = {(r, o.passes): merged_rows(spec, o, [rank[r][0][o.passes] for rank in per_rank],
                                           name)
                for r in range(args.rounds) for o in options}
        for o in options:
            last_rows.setdefault(o.passes, []).extend(rows[args.rounds - 1, o.passes])
        for b in micro_batches:
            # A TP step ends when its slowest rank does: (wall, CPU) of that rank, per step.
            rounds = [[max(step) for step in zip(*(rank[r][1][b] for rank in per_rank),
                                                strict=True)] for r in range(args.rounds)]
            round_measured = [statistics.median(w for w, _ in steps) for steps in rounds]
            measured = statistics.median(round_measured)
            q1, _, q3 = statistics.quantiles([w for steps in rounds for w, _ in steps], n=4)
            result: dict[str, Any] = {
                "micro_batch": b, "tp": tp, "num_micro_batches": args.num_micro_batches,
                "measured_s": measured, "measured_iqr_s": q3 - q1,
                "measured_cpu_s": statistics.median(
                    statistics.median(c for _, c in steps) for steps in rounds),
                "round_measured_s": round_measured, "other_load": load, "by_passes": {}}
            for o in options:
                values = [predict(spec, rows[r, o.passes], tp=tp, micro_batch=b,
                                  num_micro_batches=args.num_micro_batches)
                          for r in range(args.rounds)]
                value = statistics.median(values)
                # Each round's prediction against the steps timed right after it, in the
                # same processes: a drift of the host between rounds moves both alike.
                errors = [(p - x) / x for p, x in zip(values, round_measured, strict=True)]
                result["by_passes"][o.passes] = {
                    "predicted_s": value, "rel_error": (value - measured) / measured,
                    "round_rel_error": statistics.median(errors),
                    "round_predicted_s": values, "round_rel_errors": errors,
                    "profile_s_per_round": statistics.fmean(
                        sum(row["x_profile_s"] for row in rows[r, o.passes])
                        for r in range(args.rounds))}
            results.append(result)
    report(args, spec, name, last_rows, results)


def report(args: argparse.Namespace, spec: ModelSpec, name: str,
           last_rows: dict[int, list[dict[str, Any]]], results: list[dict[str, Any]]) -> None:
    print(f"machine: {name}; {platform.platform()}; torch {torch.__version__}")
    print(f"date: {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')}")
    print(f"command: python bench/profile_e2e.py {' '.join(sys.argv[1:])}")
    passes_list = list(last_rows)
    rows = last_rows[passes_list[-1]]
    print(f"\nrows of the last round, passes={passes_list[-1]} "
          f"({sum(r['x_noisy'] for r in rows)} of {len(rows)} noisy):\n")
    print("| kind | micro_batch | tp | forward_ms | backward_ms | IQR fwd/bwd ms "
          "| activation_bytes | noisy |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['kind']} | {r['micro_batch']} | {r['tp']} | {r['forward_ms']:.4f} | "
              f"{r['backward_ms']:.4f} | {r['x_forward_spread_ms']:.4f}/"
              f"{r['x_backward_spread_ms']:.4f} | {r['activation_bytes']} | {r['x_noisy']} |")
    print(f"\none-stage plan of {spec.name}: evaluate() vs a real timed step, {args.rounds} "
          f"rounds of profiling ({args.repeats} repeats) then {args.steps} steps. Measured: "
          "median of the rounds' median steps; predicted: median of the rounds' predictions; "
          "error: median over rounds of each round's prediction against the steps timed right "
          "after it [lowest, highest]; error of medians: predicted against measured\n")
    head = "".join(f" predicted s (passes={p}) | error [range] | error of medians |"
                   for p in passes_list)
    print(f"| micro_batch | tp | micro-batches | measured wall s (IQR of all steps) "
          f"| measured CPU s | other load |{head}")
    print("|---|---|---|---|---|---|" + "---|---|---|" * len(passes_list))
    for r in results:
        cells = ""
        for e in r["by_passes"].values():
            errs = e["round_rel_errors"]
            cells += (f" {e['predicted_s']:.5f} | {100 * e['round_rel_error']:+.1f}% "
                      f"[{100 * min(errs):+.0f}%, {100 * max(errs):+.0f}%] | "
                      f"{100 * e['rel_error']:+.1f}% |")
        share = "n/a" if r["other_load"] is None else f"{100 * r['other_load']:.0f}%"
        print(f"| {r['micro_batch']} | {r['tp']} | {r['num_micro_batches']} | "
              f"{r['measured_s']:.5f} ({r['measured_iqr_s']:.5f}) | {r['measured_cpu_s']:.5f} | "
              f"{share} |{cells}")
    print()
    for p in passes_list:
        cost = {r["tp"]: r["by_passes"][p]["profile_s_per_round"] for r in results}
        print(f"profiling, passes={p}: " + ", ".join(
            f"TP {tp}: {seconds:.1f} s per round for "
            f"{sum(row['tp'] == tp for row in last_rows[p])} points"
            for tp, seconds in cost.items()))
    if args.json:
        args.json.write_text(json.dumps({"rows": last_rows, "results": results}, indent=1))


if __name__ == "__main__":
    main()
