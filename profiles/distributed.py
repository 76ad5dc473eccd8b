"""Run a function in N processes that share one torch.distributed group.

Two ways in, one worker body:
- `spawn(fn, world_size=..., backend=...)` starts the processes itself
  (torch.multiprocessing, spawn start method) on one machine, rendezvous
  through a file in a temporary folder (no ports to collide), and returns each
  rank's result;
- under `torchrun`, the processes already exist: `init_from_env()` joins the
  group that RANK / WORLD_SIZE / MASTER_ADDR describe.

`fn(ctx: DistContext, *args)` must be a module-level function (spawn pickles
it by name) and return something picklable.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["DistContext", "spawn", "init_from_env", "backend_for", "device_for",
           "threads_per_process", "report_progress"]

POLL_S = 0.2
"""How often `spawn` looks for progress lines while its processes run."""


@dataclass(frozen=True, kw_only=True)
class DistContext:
    """Where this process sits once the group is up."""

    rank: int
    """Global rank, 0..world_size-1."""
    world_size: int
    """Processes in the group."""
    local_rank: int
    """Rank within this machine; selects the GPU."""
    device: str
    """`cuda:<local_rank>` on GPU, `cpu` otherwise."""
    progress_path: str | None = None
    """Where rank 0's `report_progress` lines go (spawn's `on_progress`); None: nowhere."""


def report_progress(ctx: DistContext, line: str) -> None:
    """Hand one line to the spawner's `on_progress` now (rank 0 only; others are ignored)."""
    if ctx.rank == 0 and ctx.progress_path is not None:
        with open(ctx.progress_path, "a") as sink:
            sink.write(line.replace("\n", " ") + "\n")


def backend_for(device: str) -> str:
    """NCCL for GPUs, gloo for CPU: the backends torch supports best on each."""
    return "nccl" if device.startswith("cuda") else "gloo"


def threads_per_process(world_size: int) -> int:
    """Intra-op threads for each of `world_size` CPU processes: the usable cores split evenly.

    Usable cores are this process's CPU affinity (a container's cpuset, `taskset`), not
    `os.cpu_count()`, which counts every core of the host.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity call on this platform (macOS, Windows)
        cores = os.cpu_count() or 1
    return max(1, cores // world_size)


def device_for(device: str, local_rank: int) -> str:
    return f"cuda:{local_rank}" if device.startswith("cuda") else "cpu"


def spawn(
    fn: Callable[..., Any],
    *,
    world_size: int,
    device: str = "cpu",
    args: tuple[Any, ...] = (),
    timeout_s: float = 300.0,
    on_progress: Callable[[str], None] | None = None,
) -> list[Any]:
    """Run `fn(ctx, *args)` on `world_size` local processes; their results, by rank.

    `on_progress` receives each line rank 0 passes to `report_progress`, while the
    processes run."""
    if world_size < 1:
        raise ValueError(f"world_size is {world_size}; it must be >= 1")
    if device.startswith("cuda") and torch.cuda.device_count() < world_size:
        raise ValueError(
            f"{world_size} processes need {world_size} GPUs but this machine has "
            f"{torch.cuda.device_count()}; lower the TP degree or use more GPUs"
        )
    with tempfile.TemporaryDirectory(prefix="hetplan-dist-") as tmp:
        progress = _ProgressFile(Path(tmp, "progress"), on_progress)
        try:
            processes = mp.spawn(
                _worker,
                args=(world_size, device, tmp, timeout_s, fn, args),
                nprocs=world_size,
                join=False,
            )
            assert processes is not None  # join=False always returns the processes
            while not processes.join(timeout=POLL_S):
                progress.forward_new_lines()
            progress.forward_new_lines()
        except mp.ProcessRaisedException as error:
            # The child's traceback is in the message; its last line says what went wrong.
            last = str(error).strip().splitlines()[-1]
            raise RuntimeError(f"a worker of {world_size} failed: {last}") from error
        except mp.ProcessExitedException:
            # A backend's threads can abort a process at teardown (gloo under DeepSpeed:
            # "terminate called without an active exception"), after its result is written:
            # the work is done if every rank wrote one.
            if not all(Path(tmp, f"result-{r}.pkl").exists() for r in range(world_size)):
                raise
        return [pickle.loads(Path(tmp, f"result-{r}.pkl").read_bytes()) for r in range(world_size)]


class _ProgressFile:
    """The lines rank 0 appended to `path` that `on_progress` has not seen yet."""

    def __init__(self, path: Path, on_progress: Callable[[str], None] | None) -> None:
        self.path = path
        self.on_progress = on_progress
        self.offset = 0

    def forward_new_lines(self) -> None:
        if self.on_progress is None or not self.path.exists():
            return
        with self.path.open("rb") as source:
            source.seek(self.offset)
            data = source.read()
        complete = data[: data.rfind(b"\n") + 1]  # a line being written waits for the next poll
        self.offset += len(complete)
        for line in complete.decode().splitlines():
            self.on_progress(line)

def _worker(
    rank: int,
    world_size: int,
    device: str,
    folder: str,
    timeout_s: float,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
) -> None:
    if not device.startswith("cuda"):
        # N processes on one CPU: split the cores, or they thrash each other.
        torch.set_num_threads(threads_per_process(world_size))
    else:
        torch.cuda.set_device(rank)
    dist.init_process_group(
        backend_for(device),
        init_method=f"file://{folder}/rendezvous",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )
    try:
        ctx = DistContext(rank=rank, world_size=world_size, local_rank=rank,
                          device=device_for(device, rank),
                          progress_path=str(Path(folder, "progress")))
        result = fn(ctx, *args)
        written = Path(folder, f"result-{rank}.pkl.part")
        written.write_bytes(pickle.dumps(result))
        written.replace(Path(folder, f"result-{rank}.pkl"))  # whole, or not there at all
    finally:
        dist.destroy_process_group()


def init_from_env(device: str, timeout_s: float = 300.0) -> DistContext:
    """Join the group `torchrun` describes in the environment (RANK, WORLD_SIZE, ...)."""
    missing = [k for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK") if k not in os.environ]
    if missing:
        raise RuntimeError(f"not under torchrun: {missing} unset; start with torchrun, or spawn")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    if device.startswith("cuda"):
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend_for(device), timeout=timedelta(seconds=timeout_s))
    return DistContext(rank=rank, world_size=world, local_rank=local_rank,
                       device=device_for(device, local_rank))
