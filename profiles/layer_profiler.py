"""Measure forward/backward time and saved activations of each layer kind.

For every (kind, micro_batch, tp) point: build one layer of that kind, run
`warmup` untimed forward+backward passes, then `repeats` timed repeats of
`passes` back-to-back forward+backward passes each. A repeat's sample is its
mean pass time; the row keeps the median and interquartile range of those
samples. Time comes from CUDA events on a GPU (device time, no host jitter)
and from `time.perf_counter_ns` on CPU.

Why a mean over several passes, and not the median of single passes: the
estimator adds layer times up, and a training step is a sum of many passes, so
the quantity a row must estimate is the mean pass time. Where single passes
are right-skewed, the median of single passes falls short of that mean. TP
collectives make them so: each all-reduce waits for the peer to be scheduled,
usually briefly, sometimes for a scheduler time slice. On the 2-vCPU
development machine a tiny-gpt TP=2 block's forward had a p90 of 2.5x its
median, and sums of single-pass medians (`passes=1`) predicted real steps
timed in the same processes 5-23% too fast in 6 of 6 TP=2 cases, while 8-pass
means came within -6.5% to +8.5% (BENCHMARKS.md section 5). The median over
repeats still drops a repeat that a rare stall hit; the mean within one keeps
the frequent short waits a step pays.

`activation_bytes` is what autograd keeps for backward: a saved-tensors hook
sees every tensor an operation stores, and the distinct storages among them
that are not parameters are summed. That is the per-micro-batch memory that
docs/formats.md's memory model multiplies by the number of micro-batches in flight.

TP points (tp > 1) run in `tp` processes, one per GPU (NCCL) or CPU process
(gloo), each holding its Megatron shard; a barrier starts every repeat on all
ranks together, as a step starts, and its passes then run back to back as a
step's micro-batches do; the slowest rank's median is the row's time, since a
TP step ends when its last rank does. Points that run out of memory are skipped
and reported, not fatal.
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from profiles.distributed import DistContext, init_from_env, spawn
from profiles.models import (
    BLOCK,
    EMBEDDING,
    HEAD,
    LOCAL_HEAD,
    ModelSpec,
    check_tp,
    layer_kinds,
    layer_params,
)
from profiles.rows import LayerPoint, SkippedPoint, merge_ranks, point_row, summarize
from profiles.torch_layers import build_layer

__all__ = [
    "ProfileOptions",
    "LayerProfile",
    "profile_layers",
    "profile_layers_torchrun",
    "profile_points",
    "saved_activation_bytes",
    "device_name",
]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True, kw_only=True)
class ProfileOptions:
    """What to measure and how carefully."""

    micro_batches: tuple[int, ...]
    """Micro-batch sizes to profile; every kind is measured at each."""
    tp_sizes: tuple[int, ...] = (1,)
    """Tensor-parallel degrees; each > 1 runs in that many processes."""
    device: str = "cpu"
    """`"cpu"` or `"cuda"`."""
    dtype: str | None = None
    """`"float32"`, `"bfloat16"` or `"float16"`; None: bf16 on GPU, fp32 on CPU."""
    warmup: int = 3
    """Untimed passes first: allocator growth, kernel selection, caches."""
    repeats: int = 10
    """Timed repeats; the median of their samples is reported."""
    passes: int = 8
    """Back-to-back forward+backward passes per repeat; a repeat's sample is their mean
    (see the module docstring for why). 1 times single passes."""
    noise_threshold: float = 0.10
    """A point is flagged noisy when its spread exceeds this fraction of its median."""
    kinds: tuple[str, ...] = (EMBEDDING, BLOCK, HEAD)
    """Layer kinds to profile; add `local_head` for a job whose schedule is `local` (its
    `job.local_head_kind` is then `local_head`)."""
    seed: int = 0
    cpu_threads: int | None = None
    """CPU only: intra-op threads per process. None: torch's default for TP=1 and
    the cores split evenly among the processes for TP > 1."""
    cpu_clock: str = "wall"
    """CPU only: `"wall"` (perf_counter) or `"process"` (CPU seconds of this process,
    blind to time the scheduler gives other processes, so usable on a shared
    machine; TP=1 only, since waiting for a collective uses no CPU)."""

    def __post_init__(self) -> None:
        if not self.micro_batches or min(self.micro_batches) < 1:
            raise ValueError(f"micro_batches {self.micro_batches}: give sizes >= 1")
        if not self.tp_sizes or min(self.tp_sizes) < 1:
            raise ValueError(f"tp_sizes {self.tp_sizes}: give degrees >= 1")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device {self.device!r}: use 'cpu' or 'cuda'")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r}: use one of {sorted(DTYPES)}")
        if self.cpu_clock not in ("wall", "process"):
            raise ValueError(f"cpu_clock {self.cpu_clock!r}: use 'wall' or 'process'")
        if self.cpu_clock == "process" and (self.device != "cpu" or max(self.tp_sizes) > 1):
            raise ValueError("cpu_clock 'process' times CPU work only: use it with device cpu "
                             "and tp 1, or use 'wall'")
        if self.repeats < 1 or self.warmup < 0 or self.passes < 1:
            raise ValueError(f"repeats={self.repeats}, warmup={self.warmup}, passes={self.passes}: "
                             "need repeats >= 1, warmup >= 0, passes >= 1")

    @property
    def dtype_name(self) -> str:
        return self.dtype or ("bfloat16" if self.device == "cuda" else "float32")

    @property
    def timer(self) -> str:
        if self.device == "cuda":
            return "cuda_events"
        return "process_time" if self.cpu_clock == "process" else "perf_counter"


@dataclass(kw_only=True)
class LayerProfile:
    """Merged points of all TP degrees, and the points that could not be measured."""

    spec: ModelSpec
    options: ProfileOptions
    device_name: str
    points: list[LayerPoint] = field(default_factory=list)
    skipped: list[SkippedPoint] = field(default_factory=list)

    def rows(self, gpu_type: str) -> list[dict[str, Any]]:
        """docs/formats.md profile rows, labelled `measured` on `device_name`."""
        return [
            point_row(p, gpu_type=gpu_type, device_name=self.device_name, model=self.spec.name,
                      dtype=self.options.dtype_name, noise_threshold=self.options.noise_threshold,
                      timer=self.options.timer)
            for p in self.points
        ]


def device_name(device: str) -> str:
    """Human name of the device rows are measured on."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name()
    return f"cpu: {_cpu_model()}"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass  # not Linux: fall back to what platform knows
    return platform.processor() or platform.machine()


def profile_layers(spec: ModelSpec, options: ProfileOptions) -> LayerProfile:
    """Profile every requested point; TP > 1 in freshly spawned process groups."""
    if options.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' asked for but torch sees no GPU; use --device cpu")
    for tp in options.tp_sizes:
        check_tp(spec, tp)  # before spawning anything: the message beats a dead worker's
    profile = LayerProfile(spec=spec, options=options, device_name=device_name(options.device))
    for tp in options.tp_sizes:
        if tp == 1:
            results = [profile_points(spec, options, tp=1, ctx=None)]
        else:
            results = spawn(_profile_rank, world_size=tp, device=options.device,
                            args=(spec, options))
        _merge_into(profile, results)
    return profile


def profile_layers_torchrun(spec: ModelSpec, options: ProfileOptions) -> LayerProfile | None:
    """Under `torchrun`: profile TP = WORLD_SIZE on every rank; rank 0 gets the profile.

    The other ranks return None. Use this across GPUs that `spawn` cannot
    reach (several nodes) or to let torchrun own process placement.
    """
    ctx = init_from_env(options.device)
    if options.tp_sizes != (ctx.world_size,):
        raise ValueError(f"under torchrun the TP degree is the world size ({ctx.world_size}); "
                         f"pass --tp {ctx.world_size}, not {','.join(map(str, options.tp_sizes))}")
    try:
        mine = profile_points(spec, options, tp=ctx.world_size, ctx=ctx)
        gathered: list[Any] = [None] * ctx.world_size if ctx.rank == 0 else []
        dist.gather_object(mine, gathered if ctx.rank == 0 else None, dst=0)
    finally:
        dist.destroy_process_group()
    if ctx.rank != 0:
        return None
    profile = LayerProfile(spec=spec, options=options, device_name=device_name(ctx.device))
    _merge_into(profile, gathered)
    return profile


def _profile_rank(ctx: DistContext, spec: ModelSpec, options: ProfileOptions) -> list[Any]:
    return profile_points(spec, options, tp=ctx.world_size, ctx=ctx)


def _merge_into(profile: LayerProfile, per_rank: Sequence[list[Any]]) -> None:
    for results in zip(*per_rank, strict=True):
        skipped = [r for r in results if isinstance(r, SkippedPoint)]
        if skipped:
            profile.skipped.append(skipped[0])
        else:
            profile.points.append(merge_ranks(results))


def profile_points(
    spec: ModelSpec, options: ProfileOptions, *, tp: int, ctx: DistContext | None
) -> list[LayerPoint | SkippedPoint]:
    """This rank's measurements of every (kind, micro_batch) at degree `tp`."""
    results: list[LayerPoint | SkippedPoint] = []
    device = ctx.device if ctx else options.device
    if options.cpu_threads is not None and device == "cpu":
        torch.set_num_threads(options.cpu_threads)
    for kind in options.kinds:
        for micro_batch in options.micro_batches:
            start = time.perf_counter()
            try:
                point = _measure(spec, options, kind=kind, micro_batch=micro_batch, tp=tp,
                                 ctx=ctx, device=device)
                results.append(_with_wall(point, time.perf_counter() - start))
            except torch.OutOfMemoryError as error:
                results.append(_skip(kind, micro_batch, tp, error, device))
            except RuntimeError as error:
                # CPU allocation failures are plain RuntimeErrors.
                if "can't allocate memory" not in str(error):
                    raise
                results.append(_skip(kind, micro_batch, tp, error, device))
    return results


def _skip(kind: str, micro_batch: int, tp: int, error: Exception, device: str) -> SkippedPoint:
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return SkippedPoint(kind=kind, micro_batch=micro_batch, tp=tp,
                        reason=f"out of memory: {first_line[:200]}")


def _with_wall(point: LayerPoint, wall_s: float) -> LayerPoint:
    return LayerPoint(**{**point.__dict__, "wall_s": wall_s})


def _measure(
    spec: ModelSpec, options: ProfileOptions, *, kind: str, micro_batch: int, tp: int,
    ctx: DistContext | None, device: str,
) -> LayerPoint:
    dtype = DTYPES[options.dtype_name]
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(device)  # the peak reported is this point's
    # A local head reads the last block's output: the same shapes after any block.
    index = spec.num_layers - 2 if kind == LOCAL_HEAD else layer_kinds(spec).index(kind)
    layer = build_layer(spec, kind, layer_index=index, seed=options.seed,
                        tp_rank=ctx.rank if ctx else 0, tp_size=tp, dtype=dtype, device=device)
    inputs = _inputs(spec, kind, micro_batch, dtype=dtype, device=device, seed=options.seed)
    output, activation = saved_activation_bytes(layer, inputs)
    head = kind in (HEAD, LOCAL_HEAD)
    grad_out = torch.ones_like(output) if head else torch.randn_like(output)
    output_bytes = 0 if head else output.numel() * output.element_size() // micro_batch
    del output
    timer = _CudaTimer() if device.startswith("cuda") else _CpuTimer(
        time.process_time_ns if options.cpu_clock == "process" else time.perf_counter_ns)

    def run() -> torch.Tensor:
        return layer(*inputs)

    for _ in range(options.warmup):
        timer.time_step(run, grad_out)
    forward_ms, backward_ms = [], []
    for _ in range(options.repeats):
        if ctx is not None and ctx.world_size > 1:
            dist.barrier()  # all ranks start the repeat together, as they start a step
        # Back to back, as a step's micro-batches run: the mean keeps every wait they pay.
        passes = [timer.time_step(run, grad_out) for _ in range(options.passes)]
        forward_ms.append(statistics.fmean(fwd for fwd, _ in passes))
        backward_ms.append(statistics.fmean(bwd for _, bwd in passes))
    if device.startswith("cuda"):
        extra: tuple[tuple[str, Any], ...] = (
            ("x_passes", options.passes),
            ("x_allocator_peak_bytes", torch.cuda.max_memory_allocated(device)))
    else:
        # Threads of the process that measured this point (TP ranks split the cores).
        extra = (("x_passes", options.passes), ("x_cpu_threads", torch.get_num_threads()))
    return LayerPoint(
        kind=kind, micro_batch=micro_batch, tp=tp,
        forward=summarize(forward_ms), backward=summarize(backward_ms),
        activation_bytes=activation, params=layer_params(spec, kind),
        local_params=sum(p.numel() for p in layer.parameters()),
        output_bytes_per_sample=output_bytes, wall_s=0.0, extra=extra,
    )


def _inputs(
    spec: ModelSpec, kind: str, micro_batch: int, *, dtype: torch.dtype, device: str, seed: int
) -> tuple[torch.Tensor, ...]:
    """What the layer receives in a pipeline: token ids, or hidden states that need grad."""
    gen = torch.Generator().manual_seed(seed + 1)
    shape = (micro_batch, spec.seq_len)
    ids = torch.randint(0, spec.vocab_size, shape, generator=gen).to(device)
    if kind == EMBEDDING:
        return (ids,)
    hidden = torch.randn(*shape, spec.hidden, generator=gen).to(device=device, dtype=dtype)
    hidden.requires_grad_(True)  # a stage boundary: backward must produce the input gradient
    return (hidden,) if kind == BLOCK else (hidden, ids)  # heads take the labels too


def saved_activation_bytes(
    layer: torch.nn.Module, inputs: Sequence[torch.Tensor]
) -> tuple[torch.Tensor, int]:
    """Run `layer(*inputs)` once; its output and the bytes autograd saved for backward.

    Counts each storage once (views of one buffer, such as q, k and v split
    from the fused QKV output, share it) and leaves out parameters and their
    views, which are model state, not activations.
    """
    param_storages = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in param_storages and ptr != 0:
            saved[ptr] = max(saved.get(ptr, 0), storage.nbytes())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        output = layer(*inputs)
    return output, sum(saved.values())


class _CpuTimer:
    """Forward and backward on the CPU, where the host is the device, by `clock_ns`."""

    def __init__(self, clock_ns: Callable[[], int]) -> None:
        self.clock_ns = clock_ns

    def time_step(
        self, forward: Callable[[], torch.Tensor], grad_out: torch.Tensor
    ) -> tuple[float, float]:
        t0 = self.clock_ns()
        output = forward()
        t1 = self.clock_ns()
        output.backward(grad_out)
        t2 = self.clock_ns()
        return (t1 - t0) / 1e6, (t2 - t1) / 1e6


class _CudaTimer:
    """Device time between CUDA events, so host-side jitter does not count."""

    def __init__(self) -> None:
        self.events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]

    def time_step(
        self, forward: Callable[[], torch.Tensor], grad_out: torch.Tensor
    ) -> tuple[float, float]:
        start, mid, end = self.events
        start.record()
        output = forward()
        mid.record()
        output.backward(grad_out)
        end.record()
        end.synchronize()
        return start.elapsed_time(mid), mid.elapsed_time(end)
