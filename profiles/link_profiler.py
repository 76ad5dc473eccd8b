"""Measure point-to-point and all-reduce bandwidth and latency with torch.distributed.

Run in a process group of at least 2 ranks (spawned here on one machine, or
under `torchrun` across machines). For each message size:

- point-to-point: rank 0 sends to rank 1, which sends back (ping-pong); the
  one-way time is half the round trip. Bandwidth = bytes / one-way time.
- all-reduce (sum, all ranks): algorithm bandwidth `algbw = bytes / time`
  and bus bandwidth `busbw = algbw * 2(n-1)/n`, as nccl-tests defines it
  (doc/PERFORMANCE.md of NVIDIA/nccl-tests), which makes all-reduce numbers
  comparable with the link's point-to-point speed whatever the rank count.

A link row for the service takes its bandwidth from the largest message's
point-to-point bandwidth and its latency from the fastest one-way time among
small messages (up to 4 KiB, where bytes / bandwidth is negligible): the two
ends of docs/formats.md's `latency + bytes / bandwidth`. The minimum over small
sizes, not the smallest size alone, because one size's median can still
catch a descheduled process on a busy host.
Timing uses CUDA events on GPU, `perf_counter` on CPU, after a barrier.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist

from profiles.distributed import DistContext, spawn

__all__ = [
    "LinkPoint",
    "LinkProfile",
    "DEFAULT_SIZES",
    "profile_links",
    "measure_links",
    "bus_bandwidth_factor",
    "link_row",
]

DEFAULT_SIZES = tuple(2**k for k in range(3, 27, 3))  # 8 B .. 64 MiB
SCOPES = ("intra_node", "inter_node", "inter_zone")
SMALL_MESSAGE_BYTES = 4096


@dataclass(frozen=True, kw_only=True)
class LinkPoint:
    """Timings of one message size."""

    size_bytes: int
    p2p_one_way_us: float
    p2p_gb_per_s: float
    allreduce_us: float
    allreduce_algbw_gb_per_s: float
    allreduce_busbw_gb_per_s: float


@dataclass(frozen=True, kw_only=True)
class LinkProfile:
    world_size: int
    backend: str
    device: str
    points: list[LinkPoint]

    def table(self) -> list[dict[str, Any]]:
        return [asdict(p) for p in self.points]


def bus_bandwidth_factor(world_size: int) -> float:
    """nccl-tests' all-reduce correction: each byte crosses 2(n-1)/n links."""
    return 2 * (world_size - 1) / world_size


def profile_links(
    *, world_size: int = 2, device: str = "cpu", sizes: tuple[int, ...] = DEFAULT_SIZES,
    repeats: int = 10, warmup: int = 3,
) -> LinkProfile:
    """Spawn `world_size` local processes and measure the link between them."""
    if world_size < 2:
        raise ValueError(f"world_size is {world_size}; a link needs at least 2 processes")
    results = spawn(_measure_rank, world_size=world_size, device=device,
                    args=(sizes, repeats, warmup))
    return results[0]  # type: ignore[no-any-return]


def _measure_rank(ctx: DistContext, sizes: tuple[int, ...], repeats: int,
                  warmup: int) -> LinkProfile:
    return measure_links(ctx, sizes=sizes, repeats=repeats, warmup=warmup)


def measure_links(
    ctx: DistContext, *, sizes: tuple[int, ...], repeats: int, warmup: int
) -> LinkProfile:
    """Inside an initialised group: every rank calls this; rank 0's result is the profile."""
    points = []
    # Connections (gloo pairs, NCCL communicators) are set up lazily by the
    # first operations; keep that out of the smallest size's latency.
    first = torch.ones(1, device=ctx.device)
    for _ in range(max(warmup, 5)):
        _ping_pong(ctx, first)
        dist.all_reduce(first)
    for size in sizes:
        # float32 elements; sizes below 4 bytes round up to one element.
        buffer = torch.ones(max(1, size // 4), dtype=torch.float32, device=ctx.device)
        nbytes = buffer.numel() * 4
        round_trip = _median_s(lambda b=buffer: _ping_pong(ctx, b), ctx, repeats, warmup)
        reduce_s = _median_s(lambda b=buffer: dist.all_reduce(b), ctx, repeats, warmup)
        one_way = round_trip / 2
        algbw = nbytes / reduce_s / 1e9
        points.append(LinkPoint(
            size_bytes=nbytes, p2p_one_way_us=one_way * 1e6, p2p_gb_per_s=nbytes / one_way / 1e9,
            allreduce_us=reduce_s * 1e6, allreduce_algbw_gb_per_s=algbw,
            allreduce_busbw_gb_per_s=algbw * bus_bandwidth_factor(ctx.world_size),
        ))
    return LinkProfile(world_size=ctx.world_size, backend=dist.get_backend(),
                       device=ctx.device, points=points)


def _ping_pong(ctx: DistContext, buffer: torch.Tensor) -> None:
    # Ranks other than 0 and 1 sit this out: the link measured is 0 <-> 1.
    if ctx.rank == 0:
        dist.send(buffer, dst=1)
        dist.recv(buffer, src=1)
    elif ctx.rank == 1:
        dist.recv(buffer, src=0)
        dist.send(buffer, dst=0)


def _median_s(op: Any, ctx: DistContext, repeats: int, warmup: int) -> float:
    samples = []
    cuda = ctx.device.startswith("cuda")
    for step in range(warmup + repeats):
        dist.barrier()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            op()
            end.record()
            end.synchronize()
            elapsed = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            op()
            elapsed = time.perf_counter() - t0
        if step >= warmup:
            samples.append(elapsed)
    # Every rank must agree on one number: take rank 0's, the one that timed both directions.
    value = torch.tensor([statistics.median(samples)], dtype=torch.float64)
    if cuda:
        value = value.to(ctx.device)
    dist.broadcast(value, src=0)
    return float(value.item())


def link_row(
    profile: LinkProfile, *, scope: str, gpu_type: str | None = None,
    zones: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """The service's link row: p2p bandwidth of the largest message, latency of small ones."""
    if scope not in SCOPES:
        raise ValueError(f"scope {scope!r}: use one of {list(SCOPES)}")
    if scope == "intra_node" and not gpu_type:
        raise ValueError("an intra_node link belongs to a GPU type; pass --gpu-type")
    if scope == "inter_zone" and not zones:
        raise ValueError("an inter_zone link joins two zones; pass --zones A,B")
    if not profile.points:
        raise ValueError("no message sizes measured")
    largest = max(profile.points, key=lambda p: p.size_bytes)
    smallest_size = min(p.size_bytes for p in profile.points)
    small = [p for p in profile.points
             if p.size_bytes <= max(SMALL_MESSAGE_BYTES, smallest_size)]
    row: dict[str, Any] = {
        "scope": scope,
        "bandwidth_gb_per_s": round(largest.p2p_gb_per_s, 4),
        "latency_us": round(min(p.p2p_one_way_us for p in small), 3),
        "x_source": "measured",
        "x_backend": profile.backend,
        "x_device": profile.device,
        "x_allreduce_busbw_gb_per_s": round(largest.allreduce_busbw_gb_per_s, 4),
        "x_world_size": profile.world_size,
    }
    if gpu_type:
        row["gpu_type"] = gpu_type
    if zones:
        row["zones"] = list(zones)
    return row
