"""`hetplan profile layers|links` and `hetplan scenario`.

PyTorch is optional: the profiler modules (which import torch) are imported
inside the command functions, so `hetplan --help` and `hetplan scenario` work
without it, and a missing torch is reported with the install command.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
from pathlib import Path
from typing import Annotated, Any

import typer

from api.cli.output import fail, load_document, stderr_console, write_json

__all__ = ["register", "parse_int_list"]

profile_app = typer.Typer(
    name="profile",
    help="Measure layer times and links (needs PyTorch).\n\nInstall it with: pip install 'hetplan[torch]'",
    no_args_is_help=True,
    rich_markup_mode=None,
)


def register(app: typer.Typer) -> None:
    app.add_typer(profile_app, name="profile")
    app.command("scenario")(scenario_command)


def parse_int_list(text: str, *, what: str) -> tuple[int, ...]:
    """`"1,2,4"` -> (1, 2, 4), or a message saying what to write instead."""
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise typer.BadParameter(f"{what} must be comma-separated integers like 1,2,4, "
                                 f"not {text!r}") from None
    if not values or min(values) < 1:
        raise typer.BadParameter(f"{what} must list integers >= 1, not {text!r}")
    return values


def _require_torch() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise fail("profiling needs PyTorch: pip install 'hetplan[torch]'") from None


def _provenance(command: str) -> dict[str, Any]:
    import torch

    return {"profiler": f"hetplan {command}", "torch": torch.__version__,
            "host": platform.node(), "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}


def _upload(kind: str, upload_url: str, token: str | None, send: Any) -> None:
    from api.client import HetplanClient
    from profiles.upload import UploadFailed

    with HetplanClient(upload_url, token) as client:
        try:
            result = send(client)
        except UploadFailed as error:
            raise fail(str(error)) from None
    for answer in result.answers:
        stderr_console().print(f"uploaded {kind}: {json.dumps(answer)[:300]}")


Output = Annotated[Path | None, typer.Option("--output", "-o", help="Write JSON here "
                                              "(default: stdout unless uploading).")]
UploadUrl = Annotated[str | None, typer.Option("--upload", help="Service base URL to upload to.")]
Token = Annotated[str | None, typer.Option("--token", envvar="HETPLAN_TOKEN",
                                           help="Bearer token with the upload scope.")]


@profile_app.command("layers")
def layers_command(
    model: Annotated[str, typer.Option(help="Model preset, e.g. tiny-gpt, gpt-1.3b, llama-7b.")],
    micro_batches: Annotated[str, typer.Option(help="Micro-batch sizes, e.g. 1,2,4,8.")] = "1,2",
    tp: Annotated[str, typer.Option(help="Tensor-parallel degrees, e.g. 1,2.")] = "1",
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    kinds: Annotated[str, typer.Option(help="Layer kinds to profile.")] = "embedding,block,head",
    gpu_type: Annotated[str | None, typer.Option(help="Name the rows carry (default: the "
                                                 "catalogue name of the GPU, or 'cpu').")] = None,
    dtype: Annotated[str | None, typer.Option(help="float32, bfloat16 or float16 (default: "
                                              "bfloat16 on GPU, float32 on CPU).")] = None,
    warmup: Annotated[int, typer.Option(min=0)] = 3,
    repeats: Annotated[int, typer.Option(min=1)] = 10,
    passes: Annotated[int, typer.Option(min=1, help="Back-to-back passes per repeat; a "
                                        "repeat's time is their mean, as a step sums them."
                                        )] = 8,
    noise_threshold: Annotated[float, typer.Option(help="Flag points whose interquartile "
                                                   "range exceeds this share of the median.")] = 0.1,
    cpu_threads: Annotated[int | None, typer.Option(min=1, help="CPU threads per process "
                                                    "(default: torch's; cores split under TP)."
                                                    )] = None,
    cpu_clock: Annotated[str, typer.Option(help="CPU only: wall, or process (CPU seconds of "
                                           "this process; for shared machines, TP 1 only)."
                                           )] = "wall",
    check_tp: Annotated[bool, typer.Option("--check-tp", help="First check that TP runs equal "
                                           "TP=1 on outputs and gradients.")] = False,
    output: Output = None,
    upload: UploadUrl = None,
    token: Token = None,
) -> None:
    """Time forward/backward and measure saved activations of each layer kind."""
    _require_torch()
    from profiles.layer_profiler import ProfileOptions, profile_layers, profile_layers_torchrun
    from profiles.models import KINDS, get_preset
    from profiles.upload import upload_rows

    kind_list = tuple(k.strip() for k in kinds.split(",") if k.strip())
    unknown = sorted(set(kind_list) - set(KINDS))
    if unknown or not kind_list:
        raise fail(f"--kinds {kinds!r}: use a comma-separated subset of {list(KINDS)}")
    try:
        spec = get_preset(model)
        options = ProfileOptions(
            kinds=kind_list,
            micro_batches=parse_int_list(micro_batches, what="--micro-batches"),
            tp_sizes=parse_int_list(tp, what="--tp"), device=device, dtype=dtype,
            warmup=warmup, repeats=repeats, passes=passes, noise_threshold=noise_threshold,
            cpu_threads=cpu_threads, cpu_clock=cpu_clock)
    except (KeyError, ValueError) as error:
        raise fail(str(error).strip("'\"")) from None
    if check_tp:
        _check_tp(spec, options)
    stderr_console().print(f"profiling {', '.join(kind_list)} of {spec.name} at micro-batches "
                           f"{micro_batches}, tp {tp} on {device}: {repeats} repeats of "
                           f"{passes} passes per point", markup=False)
    under_torchrun = int(os.environ.get("WORLD_SIZE", "1")) > 1
    try:
        profile = (profile_layers_torchrun if under_torchrun else profile_layers)(spec, options)
    except (ValueError, RuntimeError) as error:
        raise fail(str(error)) from None
    if profile is None:
        return  # a torchrun rank other than 0: rank 0 reports
    for skipped in profile.skipped:
        stderr_console().print(f"[yellow]skipped[/yellow] {skipped.kind} "
                               f"micro_batch={skipped.micro_batch} tp={skipped.tp}: "
                               f"{skipped.reason}")
    rows = profile.rows(gpu_type or _default_gpu_type(device))
    noisy = [r for r in rows if r["x_noisy"]]
    stderr_console().print(f"{len(rows)} rows on {profile.device_name}; {len(noisy)} noisy, "
                           f"{len(profile.skipped)} skipped")
    if output is not None or upload is None:
        write_json(rows, output)
    if upload is not None:
        provenance = _provenance("profile layers")
        _upload("profiles", upload, token,
                lambda c: upload_rows(c, rows, model=spec.name, provenance=provenance))


def _default_gpu_type(device: str) -> str:
    if device != "cuda":
        return "cpu"
    import torch

    from profiles.reference import guess_gpu_type

    name = torch.cuda.get_device_name()
    memory_gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    guess = guess_gpu_type(name, memory_gib)
    if guess is None:
        raise fail(f"{name!r} is not in the reference catalogue; name it with --gpu-type")
    return guess


def _check_tp(spec: Any, options: Any) -> None:
    import dataclasses

    from profiles.tp_check import compare_tensor_parallel

    # Sharding does not depend on depth or length: one block at a short
    # sequence checks it without holding a large model in float64.
    small = dataclasses.replace(spec, num_blocks=1, seq_len=min(spec.seq_len, 128))
    for size in (t for t in options.tp_sizes if t > 1):
        result = compare_tensor_parallel(small, tp_size=size, device=options.device)
        stderr_console().print(f"TP={size} against TP=1: largest difference "
                               f"{result.max_diff:.3g}")
        # float64 sums in another order differ by ~1e-16; more is a sharding bug.
        if result.max_diff > 1e-9:
            raise fail(f"TP={size} disagrees with TP=1 by {result.max_diff:.3g}; "
                       "do not trust its rows")


@profile_app.command("links")
def links_command(
    scope: Annotated[str, typer.Option(help="intra_node, inter_node or inter_zone.")] =
        "intra_node",
    gpu_type: Annotated[str | None, typer.Option(help="GPU type of an intra_node link.")] = None,
    zones: Annotated[str | None, typer.Option(help="Two zones of an inter_zone link: A,B.")] =
        None,
    world_size: Annotated[int, typer.Option(min=2, help="Processes to spawn.")] = 2,
    device: Annotated[str, typer.Option(help="cpu (gloo) or cuda (NCCL).")] = "cpu",
    sizes: Annotated[str | None, typer.Option(help="Message sizes in bytes, e.g. "
                                              "8,65536,67108864 (default 8 B .. 16 MiB).")] = None,
    repeats: Annotated[int, typer.Option(min=1)] = 10,
    output: Output = None,
    upload: UploadUrl = None,
    token: Token = None,
) -> None:
    """Point-to-point and all-reduce bandwidth and latency, as a link row."""
    _require_torch()
    from profiles.link_profiler import DEFAULT_SIZES, link_row, profile_links
    from profiles.upload import upload_links

    size_list = parse_int_list(sizes, what="--sizes") if sizes else DEFAULT_SIZES
    zone_pair = tuple(zones.split(",")) if zones else None
    if zone_pair is not None and len(zone_pair) != 2:
        raise fail(f"--zones takes two names like east,west, not {zones!r}")
    if gpu_type is None and scope == "intra_node":
        gpu_type = "cpu" if device == "cpu" else _default_gpu_type(device)
    try:
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            found = _links_under_torchrun(device, size_list, repeats)
            if found is None:
                return  # not rank 0: rank 0 reports
            profile = found
        else:
            profile = profile_links(world_size=world_size, device=device, sizes=size_list,
                                    repeats=repeats)
        row = link_row(profile, scope=scope, gpu_type=gpu_type if scope == "intra_node" else None,
                       zones=zone_pair)  # type: ignore[arg-type]
    except (ValueError, RuntimeError) as error:
        raise fail(str(error)) from None
    for point in profile.points:
        stderr_console().print(f"{point.size_bytes:>10} B  p2p {point.p2p_one_way_us:9.1f} us "
                               f"{point.p2p_gb_per_s:8.3f} GB/s  all-reduce busbw "
                               f"{point.allreduce_busbw_gb_per_s:8.3f} GB/s")
    if output is not None or upload is None:
        write_json({"links": [row], "measurements": profile.table()}, output)
    if upload is not None:
        _upload("links", upload, token, lambda c: upload_links(c, [row]))


def _links_under_torchrun(device: str, sizes: tuple[int, ...], repeats: int) -> Any:
    """Between machines: torchrun starts one process per node; ranks 0 and 1 are timed."""
    import torch.distributed as dist

    from profiles.distributed import init_from_env
    from profiles.link_profiler import measure_links

    ctx = init_from_env(device)
    try:
        profile = measure_links(ctx, sizes=sizes, repeats=repeats, warmup=3)
    finally:
        dist.destroy_process_group()
    return profile if ctx.rank == 0 else None


def scenario_command(
    cluster: Annotated[Path, typer.Option(help="Nodes file (YAML/JSON): a list of "
                                          "{name, gpu_type, gpus, zone?} or {nodes: [...], ...}.")],
    model: Annotated[str, typer.Option(help="Model preset, e.g. llama-7b.")],
    global_batch: Annotated[int, typer.Option(min=1, help="Samples per iteration.")] = 512,
    profiles: Annotated[list[Path] | None, typer.Option(
        "--profiles", help="Measured rows (JSON list); they replace estimates at their "
        "points. Repeatable.")] = None,
    output: Output = None,
) -> None:
    """Assemble a scenario from a cluster file and profiles.

    Rows come from the bundled reference profiles, replaced by measured rows where given."""
    from planner import InvalidScenario
    from profiles.models import get_preset
    from profiles.scenario import ClusterError, assemble_scenario

    try:
        spec = get_preset(model)
    except KeyError as error:
        raise fail(str(error).strip("'\"")) from None
    measured: list[dict[str, Any]] = []
    for path in profiles or []:
        rows = load_document(path)
        if not isinstance(rows, list):
            raise fail(f"{path} must hold a JSON list of profile rows (what -o of "
                       "`hetplan profile layers` writes)")
        measured.extend(rows)
    try:
        document = assemble_scenario(load_document(cluster), spec,
                                     global_batch_size=global_batch, measured_rows=measured)
    except (ClusterError, InvalidScenario) as error:
        raise fail(str(error)) from None
    write_json(document, output)
