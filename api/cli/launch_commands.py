"""`hetplan rankmap`, `hetplan export` and `hetplan launch`: from a plan to running processes.

torch is imported inside `launch` only, so the rest of the CLI (and `hetplan --help`)
works without it.
"""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from planner import PlannerError, UnsupportedExport, parse_plan
from planner.documents import Plan, Schedule, parse_scenario
from planner.export import export_with_scenario, parse_gpu_names, rank_map
from planner.export.formats import DEFAULT_MASTER_PORT


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


PlanPath = Annotated[Path, typer.Argument(help="Plan document (JSON or YAML).", exists=True,
                                          dir_okay=False)]


def _read_document(path: Path) -> Any:
    text = path.read_text()
    return yaml.safe_load(text) if path.suffix in (".yaml", ".yml") else json.loads(text)


def _load_plan(path: Path) -> Plan:
    try:
        return parse_plan(_read_document(path))
    except (json.JSONDecodeError, yaml.YAMLError) as error:
        typer.echo(f"{path}: not a JSON or YAML document ({error})", err=True)
        raise typer.Exit(2) from None
    except PlannerError as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(2) from None


def _emit(document: dict[str, Any], output: Path | None) -> None:
    text = json.dumps(document, indent=2) + "\n"
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text)


def rankmap_command(
    plan: PlanPath,
    output: Annotated[Path | None, typer.Option(help="Write the JSON here, not stdout.")] = None,
) -> None:
    """Global rank, node, local rank, pipeline, stage and TP rank of every GPU of PLAN, and
    the process groups: TP groups, stage links, per-layer gradient-sync groups."""
    try:
        _emit(rank_map(_load_plan(plan)), output)
    except PlannerError as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(2) from None


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
        help="torchrun: rendezvous host (default: the first node's name).")] = None,
    master_port: Annotated[int | None, typer.Option(
        help=f"torchrun, kubernetes, slurm: rendezvous port (default {DEFAULT_MASTER_PORT}).")
    ] = None,
    training_module: Annotated[str | None, typer.Option(
        help="torchrun, kubernetes, slurm: the module torchrun starts (default "
             "launcher.train).")] = None,
    plan_path: Annotated[str | None, typer.Option(
        help="torchrun, kubernetes, slurm: path of the plan on the nodes, passed to the "
             "training module.")] = None,
    script_arg: Annotated[list[str] | None, typer.Option(
        help="torchrun, kubernetes, slurm: an argument for the training module (repeat; "
             "write --script-arg=--steps for one that starts with '-').")] = None,
    zero_stage: Annotated[int | None, typer.Option(help="deepspeed: ZeRO stage.")] = None,
    name: Annotated[str | None, typer.Option(
        help="kubernetes, slurm: job name (default hetplan-train).")] = None,
    image: Annotated[str | None, typer.Option(help="kubernetes: container image.")] = None,
    gpu_name: Annotated[list[str] | None, typer.Option(
        help="kubernetes, slurm: what the cluster calls a GPU type, TYPE=NAME (the "
             "nvidia.com/gpu.product label, or the Slurm node feature); repeat per type.")
    ] = None,
    output: Annotated[Path | None, typer.Option(help="Write the JSON here, not stdout.")] = None,
) -> None:
    """PLAN written for a launcher: torchrun commands, torch.distributed.pipelining stages,
    Megatron-LM arguments, DeepSpeed or torchtitan settings, a Kubernetes JobSet or a Slurm
    batch script. Exit code 3 with the reasons when the format cannot express the plan."""
    loaded = _load_plan(plan)
    try:
        options = _given(master_addr=master_addr, master_port=master_port,
                         training_module=training_module, plan_path=plan_path,
                         script_args=script_arg, zero_stage=zero_stage, name=name, image=image,
                         gpu_names=None if gpu_name is None else parse_gpu_names(gpu_name))
        parsed = None if scenario is None else parse_scenario(_read_document(scenario))
        _emit(export_with_scenario(loaded, fmt.value, parsed, options), output)
    except UnsupportedExport as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(3) from None
    except (PlannerError, ValueError) as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(2) from None


def launch_command(
    plan: PlanPath,
    model: Annotated[str, typer.Option(help="Model preset whose layers the plan splits.")] = (
        "tiny-gpt"),
    steps: Annotated[int, typer.Option(min=1, help="Training steps.")] = 3,
    seed: Annotated[int, typer.Option(help="Seed of weights and data.")] = 0,
    optimizer: Annotated[OptimizerName, typer.Option(help="Optimizer.")] = OptimizerName.SGD,
    lr: Annotated[float, typer.Option(help="Learning rate.")] = 0.1,
    schedule: Annotated[Schedule | None, typer.Option(
        help="Override the plan's schedule.")] = None,
    max_processes: Annotated[int, typer.Option(
        help="Refuse plans with more GPUs than this (each becomes a local process).")] = 8,
    check: Annotated[bool, typer.Option(
        help="Also train the whole model in one process and report the largest weight "
             "difference (should be ~1e-7 or less in fp32).")] = False,
    cpu_threads: Annotated[int | None, typer.Option(
        min=1, help="Intra-op threads per process (default: the cores split evenly).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON lines.")] = False,
) -> None:
    """Run PLAN for real on this machine: one CPU process per GPU of the plan (gloo), each
    stage building only its layers, micro-batches by the plan's schedule, TP shards,
    per-layer gradient sync across pipelines. Logs each step's loss and time."""
    loaded = _load_plan(plan)
    try:
        num_gpus = rank_map(loaded)["world_size"]
    except PlannerError as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(2) from None
    if num_gpus > max_processes:
        typer.echo(f"the plan has {num_gpus} GPUs, so {num_gpus} processes; more than "
                   f"--max-processes {max_processes}. Raise it or launch a smaller plan.", err=True)
        raise typer.Exit(2)
    try:
        from launcher import TrainConfig, launch_plan
    except ImportError as error:
        typer.echo(f"hetplan launch needs PyTorch ({error}); pip install 'hetplan[torch]'",
                   err=True)
        raise typer.Exit(2) from None
    config = TrainConfig(model=model, steps=steps, seed=seed, optimizer=optimizer.value, lr=lr,
                         schedule=schedule, return_weights=check, cpu_threads=cpu_threads)
    results = launch_plan(loaded, config)
    for step, (loss, seconds) in enumerate(zip(results[0].losses, results[0].step_s,
                                               strict=True)):
        if as_json:
            typer.echo(json.dumps({"step": step, "loss": loss, "step_s": seconds}))
        else:
            typer.echo(f"step {step}  loss {loss:.6f}  time {seconds * 1e3:.1f} ms")
    if check:
        from launcher.check import max_weight_difference

        difference = max_weight_difference(loaded, config, results)
        typer.echo(json.dumps({"max_weight_difference": difference}) if as_json
                   else f"largest difference from a single-process run: {difference:.3e}")


def register(app: typer.Typer) -> None:
    app.command("rankmap")(rankmap_command)
    app.command("export")(export_command)
    app.command("launch")(launch_command)
