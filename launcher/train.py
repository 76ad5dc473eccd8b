"""Worker entry point under torchrun: `torchrun ... -m launcher.train --plan plan.json`.

The rank map numbers ranks the way torchrun does under static rendezvous, so the
RANK torchrun gives each process is its rank in the plan; `hetplan export PLAN
--format torchrun` writes the per-node commands.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

import torch.distributed as dist

from launcher.layout import launch_rank_map
from launcher.runtime import TrainConfig, run_worker
from planner.documents import Schedule, parse_plan
from planner.export.ranks import RankMap
from profiles.distributed import init_from_env

__all__ = ["check_torchrun_placement", "main"]


def check_torchrun_placement(ranks: RankMap, env: Mapping[str, str]) -> None:
    """Fail before any collective when torchrun numbered this process differently from the
    rank map (a c10d rendezvous, nodes started with other --node-rank values, ...)."""
    rank = int(env["RANK"])
    if int(env["WORLD_SIZE"]) != ranks.world_size or rank >= ranks.world_size:
        raise RuntimeError(f"torchrun started {env['WORLD_SIZE']} processes; the plan has "
                           f"{ranks.world_size} GPUs. Use the commands of hetplan export "
                           "--format torchrun")
    me = ranks.ranks[rank]
    started_as = (int(env.get("GROUP_RANK", me.node_rank)), int(env["LOCAL_RANK"]))
    if started_as != (me.node_rank, me.local_rank):
        raise RuntimeError(
            f"rank {rank} is {me.gpu} in the plan (node_rank {me.node_rank}, local_rank "
            f"{me.local_rank}) but torchrun started it as node_rank {started_as[0]}, "
            f"local_rank {started_as[1]}; launch with --rdzv-backend=static and the "
            "--node-rank of hetplan export --format torchrun")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="launcher.train", description=__doc__)
    parser.add_argument("--plan", required=True, type=Path)
    parser.add_argument("--model", default="tiny-gpt")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--schedule", choices=[s.value for s in Schedule], default=None)
    args = parser.parse_args(argv)
    config = TrainConfig(model=args.model, steps=args.steps, seed=args.seed,
                         optimizer=args.optimizer, lr=args.lr,
                         schedule=None if args.schedule is None else Schedule(args.schedule))
    document = json.loads(args.plan.read_text())
    check_torchrun_placement(launch_rank_map(parse_plan(document)), os.environ)
    ctx = init_from_env("cpu")
    result = run_worker(ctx, document, config)
    if ctx.rank == 0:
        for step, (loss, seconds) in enumerate(zip(result.losses, result.step_s, strict=True)):
            print(json.dumps({"step": step, "loss": loss, "step_s": seconds}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
