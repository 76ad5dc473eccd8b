"""A torch.distributed.pipelining driver that reads nothing but a `--format pipelining` export.

Under torchrun (the commands of `hetplan export PLAN --format torchrun --training-module
launcher.pipelining`, which pass `--plan plan.json`):

    python -m launcher.pipelining (--export pipelining.json | --plan plan.json) --out DIR

Each process finds its pipeline and stage from its rank, builds its stage's layers under
the export's module names (torchtitan's: `tok_embeddings`, `layers.<i>`, `norm`,
`lm_head`), one module and one PipelineStage per chunk (a stage of an interleaved
pipeline holds several), each run under torch.utils.checkpoint where the stage says
`recompute`; creates every pipeline group with the export's `pp_group_options`, runs one
step of the export's schedule class on its pipeline's slice of the global batch, scales
the gradients by the pipeline's batch share, all-reduces them over the `gradient_sync`
groups by module name, takes one SGD step and saves its parameters to `DIR/rank<r>.pt`.
It is the proof that the export is enough to run a plan; it handles TP 1 stages only
(a TP stage needs the model's own TP layers inside the PipelineStage).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed import pipelining
from torch.utils.checkpoint import checkpoint

from launcher.data import global_batch
from planner.documents import parse_plan
from planner.export import export_plan
from profiles.distributed import init_from_env
from profiles.torch_layers import Head, build_layer, get_preset, layer_kinds

__all__ = ["StageModule", "build_stage_module", "main", "run_step"]


class _Output(nn.Module):
    """The LM head's projection alone, so the loss can live outside the stage."""

    def __init__(self, weight: nn.Parameter) -> None:
        super().__init__()
        self.weight = weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.weight)


class StageModule(nn.Module):
    """A stage's (or a chunk's) layers named as torchtitan's decoder names them; returns
    logits on the last stage, hidden states elsewhere. With `recompute` the forward keeps
    only its input and runs again in the backward (full activation recomputation)."""

    def __init__(self, modules: dict[str, nn.Module], *, recompute: bool = False) -> None:
        super().__init__()
        self.tok_embeddings = modules.get("tok_embeddings")
        self.layers = nn.ModuleDict({name.removeprefix("layers."): module
                                     for name, module in modules.items()
                                     if name.startswith("layers.")})
        self.norm = modules.get("norm")
        self.lm_head = modules.get("lm_head")
        self.recompute = recompute

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute and torch.is_grad_enabled():
            out: torch.Tensor = checkpoint(self._layers, x, use_reentrant=False)
            return out
        return self._layers(x)

    def _layers(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok_embeddings is not None:
            x = self.tok_embeddings(x)
        for block in self.layers.values():
            x = block(x)
        if self.norm is not None:
            x = self.norm(x)
        if self.lm_head is not None:
            x = self.lm_head(x)
        return x


def build_stage_module(model: str, layers: tuple[int, int], module_names: list[list[str]],
                       *, seed: int, recompute: bool = False) -> StageModule:
    """The layers `[start, end)` of preset `model`, each under its names in `module_names`
    (the export's `layer_module_names`)."""
    spec = get_preset(model)
    kinds = layer_kinds(spec)
    modules: dict[str, nn.Module] = {}
    for layer in range(*layers):
        built = build_layer(spec, kinds[layer], layer_index=layer, seed=seed)
        names = module_names[layer]
        if isinstance(built, Head):
            modules[names[0]], modules[names[1]] = built.norm, _Output(built.weight)
        else:
            (name,) = names
            modules[name] = built
    return StageModule(modules, recompute=recompute)


def _loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


def _find_role(export: dict[str, Any], rank: int) -> tuple[dict[str, Any], dict[str, Any]]:
    for pipeline in export["pipelines"]:
        for stage in pipeline["stages"]:
            if rank in stage["ranks"]:
                if stage["tp_size"] != 1:
                    raise ValueError(f"rank {rank} is in a TP {stage['tp_size']} stage; this "
                                     "driver runs TP 1 stages only")
                return pipeline, stage
    raise ValueError(f"rank {rank} is in no stage of the export; launch world_size "
                     f"{export['world_size']} processes")


def _new_groups(export: dict[str, Any]) -> tuple[dict[tuple[int, ...], Any], dict[int, Any]]:
    """Every process creates every group in the same order, as new_group requires: the
    pipeline groups (keyed by pipeline) and the gradient-sync groups (keyed by ranks)."""
    pp_groups: dict[int, Any] = {}
    for pipeline in export["pipelines"]:
        for ranks in pipeline["pp_groups"]:
            pp_groups[pipeline["pipeline"]] = dist.new_group(ranks, **export["pp_group_options"])
    sync_groups: dict[tuple[int, ...], Any] = {}
    for entry in export["gradient_sync"]:
        for ranks in entry["rank_groups"]:
            key = tuple(sorted(ranks))
            if len(key) > 1 and key not in sync_groups:
                sync_groups[key] = dist.new_group(list(key))
    return sync_groups, pp_groups


def _chunks(stage: dict[str, Any]) -> list[dict[str, Any]]:
    """The stage's chunks, one PipelineStage each; a stage of one range is one chunk."""
    return stage.get("chunks") or [{"stage_index": stage["stage_index"],
                                    "layers": stage["layers"]}]


def run_step(export: dict[str, Any], rank: int, *, model: str, seed: int = 0, lr: float = 0.1
             ) -> dict[str, torch.Tensor]:
    """One training step of this rank's stage; its parameters after the step, by name."""
    pipeline, stage_entry = _find_role(export, rank)
    sync_groups, pp_groups = _new_groups(export)
    num_model_chunks = pipeline.get("num_model_chunks", pipeline["num_stages"])
    chunks = _chunks(stage_entry)
    modules = [build_stage_module(model, tuple(chunk["layers"]), export["layer_module_names"],
                                  seed=seed, recompute=stage_entry.get("recompute", False))
               for chunk in chunks]
    stages = [pipelining.PipelineStage(module, chunk["stage_index"], num_model_chunks,
                                       torch.device("cpu"), group=pp_groups[pipeline["pipeline"]])
              for module, chunk in zip(modules, chunks, strict=True)]
    schedule_class = getattr(pipelining, pipeline["schedule_class"])
    schedule = schedule_class(stages if len(stages) > 1 else stages[0],
                              n_microbatches=pipeline["n_microbatches"], loss_fn=_loss)
    tokens, labels = global_batch(get_preset(model), export["global_batch_size"], seed=seed,
                                  step=0)
    samples = slice(pipeline["first_sample"], pipeline["first_sample"] + pipeline["num_samples"])
    indices = {chunk["stage_index"] for chunk in chunks}
    schedule.step(*([tokens[samples]] if 0 in indices else []),
                  target=labels[samples] if num_model_chunks - 1 in indices else None)
    params = {name: param for module in modules for name, param in module.named_parameters()}
    for grad in (p.grad for p in params.values() if p.grad is not None):
        grad.mul_(pipeline["batch_share"])
    _sync_gradients(export, rank, params, sync_groups)
    with torch.no_grad():
        for param in params.values():
            if param.grad is not None:
                param.sub_(lr * param.grad)
    return {name: param.detach().clone() for name, param in params.items()}


def _sync_gradients(export: dict[str, Any], rank: int, params: dict[str, nn.Parameter],
                    groups: dict[tuple[int, ...], Any]) -> None:
    for entry in export["gradient_sync"]:
        for ranks in entry["rank_groups"]:
            key = tuple(sorted(ranks))
            if rank not in key or len(key) == 1:
                continue
            for name, param in params.items():
                if any(name.startswith(f"{module}.") for module in entry["module_names"]):
                    dist.all_reduce(param.grad, group=groups[key])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="launcher.pipelining", description=__doc__)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--export", type=Path,
                        help="The JSON of hetplan export --format pipelining.")
    source.add_argument("--plan", type=Path,
                        help="A plan (what the torchrun export passes); exported here.")
    parser.add_argument("--model", default="tiny-gpt")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--out", required=True, type=Path, help="Folder for rank<r>.pt.")
    args = parser.parse_args(argv)
    if args.export is not None:
        export = json.loads(args.export.read_text())
    else:
        export = export_plan(parse_plan(json.loads(args.plan.read_text())), "pipelining")
    ctx = init_from_env("cpu")
    weights = run_step(export, ctx.rank, model=args.model, seed=args.seed, lr=args.lr)
    torch.save(weights, args.out / f"rank{ctx.rank}.pt")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
