"""`hetplan rankmap`, `hetplan export` and `hetplan launch`: from a plan to running processes.

The planner is imported when a command runs and torch inside `launch` only, so the rest
of the CLI (and `hetplan --help`) starts fast and works without torch.
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from api.cli.output import fail, load_document, write_json

if TYPE_CHECKING:
    from planner.documents import Plan

DEFAULT_MASTER_PORT = 29500
"""torchrun's default rendezvous port (planner.export.formats uses the same; a test pins it)."""


class ExportFormat(StrEnum):
    TORCHRUN = "torchrun"
    PIPELINING = "pipelining"
    MEGATRON = "megatron"
    DEEPSPEED = "deepspeed"
    TORCHTITAN = "torchtitan"
    KUBERNETES = "kubernetes"
    SLURM = "slurm"


class OptimizerName(StrEnum):
    SGD = "sgd"
    ADAM = "adam"


PlanPath = Annotated[Path, typer.Argument(metavar="PLAN", help="Plan document (JSON or YAML).",
                                          exists=True, dir_okay=False)]
Output = Annotated[Path | None, typer.Option("-o", "--output",
                                             help="Write the JSON here, not stdout.")]


def _load_plan(path: Path) -> Plan:
    from planner import PlannerError, parse_plan

    try:
        return parse_plan(load_document(path))
    except PlannerError as error:
        raise fail(str(error)) from None


def _emit(document: dict[str, Any], output: Path | None) -> None:
    write_json(document, output, indent=2)


def rankmap_command(plan: PlanPath, output: Output = None) -> None:
    """Print the rank map of PLAN: where every GPU's process sits.

    Global rank, node, local rank, pipeline, stage and TP rank of every GPU, and the
    process groups: TP groups, stage links, per-layer gradient-sync groups."""
    from planner import PlannerError
    from planner.export import rank_map

    try:
        _emit(rank_map(_load_plan(plan)), output)
    except PlannerError as error:
        raise fail(str(error)) from None


def _given(**options: Any) -> dict[str, Any]:
    """The options the user gave (not None); each must be one the format takes."""
    return {name: value for name, value in options.items() if value is not None}


def export_command(
    plan: PlanPath,
    fmt: Annotated[ExportFormat, typer.Option("--format", "-f", help="Launcher format.")],
    scenario: Annotated[Path | None, typer.Option(
        help="Scenario of the plan: its model.layers name the layer kinds (default: embedding, "
             "blocks, head), its job.schedule is the schedule of a plan that names none, and "
             "its job.zero_stage goes into the DeepSpeed config.",
        exists=True, dir_okay=False)] = None,
    master_addr: Annotated[str | None, typer.Option(
        help="torchrun, deepspeed: rendezvous host (default: the first node's name).")] = None,
    master_port: Annotated[int | None, typer.Option(
        help=f"torchrun, deepspeed, kubernetes, slurm: rendezvous port (default "
             f"{DEFAULT_MASTER_PORT}).")
    ] = None,
    training_module: Annotated[str | None, typer.Option(
        help="torchrun, deepspeed, kubernetes, slurm: the module the launcher starts "
             "(default launcher.train).")] = None,
    plan_path: Annotated[str | None, typer.Option(
        help="torchrun, deepspeed, kubernetes, slurm: path of the plan on the nodes, passed "
             "to the training module.")] = None,
    script_arg: Annotated[list[str] | None, typer.Option(
        help="torchrun, deepspeed, kubernetes, slurm: an argument for the training module "
             "(repeat; "
             "write --script-arg=--steps for one that starts with '-').")] = None,
    zero_stage: Annotated[int | None, typer.Option(help="deepspeed: ZeRO stage.")] = None,
    name: Annotated[str | None, typer.Option(
        help="kubernetes, slurm: job name (default hetplan-train).")] = None,
    image: Annotated[str | None, typer.Option(help="kubernetes: container image.")] = None,
    gpu_name: Annotated[list[str] | None, typer.Option(
        help="kubernetes, slurm: what the cluster calls a GPU type, TYPE=NAME (the "
             "nvidia.com/gpu.product label, or the Slurm node feature); repeat per type.")
    ] = None,
    output: Output = None,
) -> None:
    """Write PLAN as a launcher's configuration.

    torchrun commands, torch.distributed.pipelining stages, Megatron-LM arguments,
    DeepSpeed or torchtitan settings, a Kubernetes JobSet or a Slurm batch script. Exit
    code 3 with the reasons when the format cannot express the plan."""
    from planner import PlannerError, UnsupportedExport
    from planner.documents import parse_scenario
    from planner.export import export_with_scenario, parse_gpu_names

    loaded = _load_plan(plan)
    try:
        options = _given(master_addr=master_addr, master_port=master_port,
                         training_module=training_module, plan_path=plan_path,
                         script_args=script_arg, zero_stage=zero_stage, name=name, image=image,
                         gpu_names=None if gpu_name is None else parse_gpu_names(gpu_name))
        parsed = None if scenario is None else parse_scenario(load_document(scenario))
        _emit(export_with_scenario(loaded, fmt.value, parsed, options), output)
    except UnsupportedExport as error:
        raise fail(" ".join(str(error).split()), code=3) from None
    except (PlannerError, ValueError) as error:
        raise fail(str(error)) from None


def launch_command(
    plan: PlanPath,
    model: Annotated[str, typer.Option(help="Model preset whose layers the plan splits.")] = (
        "tiny-gpt"),
    steps: Annotated[int, typer.Option(min=1, help="Training steps.")] = 3,
    seed: Annotated[int, typer.Option(help="Seed of weights and data.")] = 0,
    optimizer: Annotated[OptimizerName, typer.Option(help="Optimizer.")] = OptimizerName.SGD,
    lr: Annotated[float, typer.Option(help="Learning rate.")] = 0.1,
    schedule: Annotated[str | None, typer.Option(
        help="Run this schedule instead of the plan's (1f1b, gpipe, interleaved-1f1b, "
             "local).")] = None,
    max_processes: Annotated[int, typer.Option(
        help="Refuse plans with more GPUs than this (each becomes a local process).")] = 8,
    check: Annotated[bool, typer.Option(
        help="Also train the whole model in one process (local learning on the plan's "
             "blocks under schedule local) and report the largest weight difference "
             "(should be ~1e-7 or less in fp32).")] = False,
    cpu_threads: Annotated[int | None, typer.Option(
        min=1, help="Intra-op threads per process (default: the cores split evenly).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON lines.")] = False,
) -> None:
    """Train PLAN for real on this machine, one CPU process per GPU.

    Each process (gloo) builds only its stage's layers and TP shard, runs micro-batches
    by the plan's schedule and syncs gradients per layer across pipelines. The model and
    plan are checked before any process starts; each step's loss and time is printed as
    the step ends."""
    from planner import PlannerError
    from planner.documents import Schedule

    loaded = _load_plan(plan)
    # One process per GPU; the rank map (which reads one range per stage, so not yet
    # interleaved plans) is built by the launcher, which checks the plan before it spawns.
    num_gpus = len({gpu for p in loaded.pipelines for stage in p.stages for gpu in stage.gpus})
    try:
        chosen = None if schedule is None else Schedule(schedule)
    except ValueError:
        raise fail(f"--schedule {schedule!r}: use one of {[s.value for s in Schedule]}") from None
    if num_gpus > max_processes:
        raise fail(f"the plan has {num_gpus} GPUs, so {num_gpus} processes; more than "
                   f"--max-processes {max_processes}. Raise it or launch a smaller plan.")
    try:
        from launcher import TrainConfig, launch_plan
        from launcher.launch import StepReport
    except ImportError as error:
        raise fail(f"hetplan launch needs PyTorch ({error}); pip install 'hetplan[torch]'") \
            from None
    config = TrainConfig(model=model, steps=steps, seed=seed, optimizer=optimizer.value, lr=lr,
                         schedule=chosen, return_weights=check, cpu_threads=cpu_threads)

    def print_step(report: StepReport) -> None:
        if as_json:
            typer.echo(json.dumps({"step": report.step, "loss": report.loss,
                                   "step_s": report.step_s}))
        else:
            typer.echo(f"step {report.step}  loss {report.loss:.6f}  "
                       f"time {report.step_s * 1e3:.1f} ms")

    try:
        results = launch_plan(loaded, config, on_step=print_step)
    except (PlannerError, ValueError, RuntimeError) as error:
        raise fail(str(error)) from None
    if check:
        from launcher.check import max_weight_difference

        difference = max_weight_difference(loaded, config, results)
        typer.echo(json.dumps({"max_weight_difference": difference}) if as_json
                   else f"largest difference from a single-process run: {difference:.3e}")


def register(app: typer.Typer) -> None:
    app.command("rankmap")(rankmap_command)
    app.command("export")(export_command)
    app.command("launch")(launch_command)
