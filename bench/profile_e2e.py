"""Does a plan's estimate from measured rows match a real timed training step?

1. Profile the model's layers (hetplan's layer profiler) at the given micro-batch
   sizes and TP degrees.
2. For each (micro_batch, tp): a scenario from those rows, a one-pipeline,
   one-stage plan holding every layer, and `planner.evaluate`'s iteration time.
3. Time real training steps of the same layers: `num_micro_batches`
   forward+backward passes through all layers (embedding -> blocks -> head,
   loss.backward()), TP > 1 in spawned gloo/NCCL processes; median of steps.
4. Print a Markdown table: predicted, measured, relative error; plus the
   profiling cost per point.

    python bench/profile_e2e.py --model tiny-gpt --micro-batches 1,2 --tp 1,2 \
        --num-micro-batches 8 --steps 30 [--device cpu|cuda] [--json out.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner import evaluate, parse_plan, parse_scenario  # noqa: E402
from profiles.distributed import DistContext, spawn  # noqa: E402
from profiles.layer_profiler import DTYPES, ProfileOptions, profile_layers  # noqa: E402
from profiles.models import ModelSpec, get_preset, layer_kinds  # noqa: E402
from profiles.rows import kinds_from_rows  # noqa: E402
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


def _rank_steps(ctx: DistContext, *args: Any) -> list[tuple[float, float]]:
    return timed_steps(ctx, *args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-gpt")
    parser.add_argument("--micro-batches", default="1,2")
    parser.add_argument("--tp", default="1,2")
    parser.add_argument("--num-micro-batches", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=30)
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
    options = ProfileOptions(micro_batches=micro_batches, tp_sizes=tps, device=args.device,
                             warmup=5, repeats=args.repeats, cpu_threads=args.threads,
                             cpu_clock=args.cpu_clock)
    started = time.perf_counter()
    profile = profile_layers(spec, options)
    profile_s = time.perf_counter() - started
    rows = profile.rows("dev")
    results = []
    for tp in tps:
        for b in micro_batches:
            m = args.num_micro_batches
            scenario = parse_scenario(scenario_for(spec, rows, gpus=max(tps), batch=b * m))
            evaluation = evaluate(scenario, parse_plan(one_stage_plan(
                spec, micro_batch=b, num_micro_batches=m, tp=tp)))
            assert evaluation.valid, evaluation.errors
            step_args = (spec, b, m, args.steps, 3, options.dtype_name, args.device,
                         args.threads)
            if tp == 1:
                pairs = timed_steps(None, *step_args)
            else:
                per_rank = spawn(_rank_steps, world_size=tp, device=args.device, args=step_args)
                # A TP step ends when its slowest rank does.
                pairs = [max(step) for step in zip(*per_rank, strict=True)]
            samples = [wall for wall, _ in pairs]
            measured = statistics.median(samples)
            cpu = statistics.median(c for _, c in pairs)
            q1, _, q3 = statistics.quantiles(samples, n=4)
            predicted = evaluation.iteration_s
            assert predicted is not None
            results.append({"micro_batch": b, "tp": tp, "num_micro_batches": m,
                            "predicted_s": predicted, "measured_s": measured,
                            "measured_iqr_s": q3 - q1, "measured_cpu_s": cpu,
                            "rel_error": (predicted - measured) / measured,
                            "rel_error_cpu": (predicted - cpu) / cpu})
    report(args, spec, profile, rows, profile_s, results)


def report(args: argparse.Namespace, spec: ModelSpec, profile: Any, rows: list[dict[str, Any]],
           profile_s: float, results: list[dict[str, Any]]) -> None:
    print(f"machine: {profile.device_name}; {platform.platform()}; torch {torch.__version__}")
    print(f"date: {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')}")
    print(f"command: python bench/profile_e2e.py {' '.join(sys.argv[1:])}")
    print(f"\nprofiling: {len(rows)} points in {profile_s:.1f} s "
          f"({profile_s / max(1, len(rows)):.2f} s per point incl. process start-up; "
          f"{len(profile.skipped)} skipped, {sum(r['x_noisy'] for r in rows)} noisy)\n")
    print("| kind | micro_batch | tp | forward_ms | backward_ms | IQR fwd/bwd ms "
          "| activation_bytes | noisy |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['kind']} | {r['micro_batch']} | {r['tp']} | {r['forward_ms']:.4f} | "
              f"{r['backward_ms']:.4f} | {r['x_forward_spread_ms']:.4f}/"
              f"{r['x_backward_spread_ms']:.4f} | {r['activation_bytes']} | {r['x_noisy']} |")
    print(f"\none-stage plan of {spec.name}: evaluate() vs a real timed step "
          f"(median of {args.steps})\n")
    print("| micro_batch | tp | micro-batches | predicted s | measured wall s (IQR) | error "
          "| measured CPU s | error vs CPU |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['micro_batch']} | {r['tp']} | {r['num_micro_batches']} | "
              f"{r['predicted_s']:.5f} | {r['measured_s']:.5f} ({r['measured_iqr_s']:.5f}) | "
              f"{100 * r['rel_error']:+.1f}% | {r['measured_cpu_s']:.5f} | "
              f"{100 * r['rel_error_cpu']:+.1f}% |")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "results": results,
                                         "profile_s": profile_s}, indent=1))


if __name__ == "__main__":
    main()
