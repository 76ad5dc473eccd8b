"""DeepSpeed's PipelineModule with the stage bounds a plan gives (`--format deepspeed`).

PipelineModule's `partition_method` knows `uniform`, `parameters` and
`type:<regex>`, never explicit bounds, so a plan's uneven split cannot be said
in its arguments. The subclass below takes the export's `stage_bounds` and sets
them where PipelineModule would compute its partition; everything else
(topology, engine, schedule) is DeepSpeed's own. Copy it into a training script
or import it (this module imports DeepSpeed, which hetplan does not require):

    from launcher.deepspeed_pipe import BoundedPipelineModule
    module = BoundedPipelineModule(layers, stage_bounds=export["pipeline_module"]["stage_bounds"],
                                   topology=ProcessTopology(**export["topology"]), loss_fn=...)

When every stage recomputes, also pass the export's `activation_checkpoint_interval`
(`run_step` below does) and merge its ds_config, which asks for the non-reentrant checkpoint.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import deepspeed
import torch
from deepspeed.pipe import PipelineModule
from deepspeed.runtime.pipe.topology import ProcessTopology

from launcher.data import global_batch
from profiles.torch_layers import Head, build_layer, get_preset, layer_kinds

__all__ = ["BoundedPipelineModule", "run_step"]


class BoundedPipelineModule(PipelineModule):  # type: ignore[misc]
    """A PipelineModule whose stage s holds layers `[stage_bounds[s], stage_bounds[s + 1])`."""

    def __init__(self, layers: Sequence[Any], *, stage_bounds: Sequence[int], **kwargs: Any
                 ) -> None:
        bounds = list(stage_bounds)
        if bounds[0] != 0 or bounds[-1] != len(layers) or bounds != sorted(set(bounds)):
            raise ValueError(f"stage_bounds {bounds} must rise strictly from 0 to the "
                             f"{len(layers)} layers; pass the export's pipeline_module.stage_bounds")
        # Set before PipelineModule.__init__, which partitions as it builds.
        object.__setattr__(self, "_stage_bounds", bounds)
        super().__init__(layers, **kwargs)

    def _partition_layers(self, method: str = "uniform") -> None:
        if self.num_stages != len(self._stage_bounds) - 1:
            raise ValueError(f"the topology has {self.num_stages} pipeline stages but "
                             f"stage_bounds {self._stage_bounds} describe "
                             f"{len(self._stage_bounds) - 1}")
        self.parts = list(self._stage_bounds)
        stage = self._topo.get_coord(self.global_rank).pipe
        self._set_bounds(start=self.parts[stage], stop=self.parts[stage + 1])


class _Logits(torch.nn.Module):
    """A head without its loss (the loss is the PipelineModule's loss_fn), its parameters
    named as in the head."""

    def __init__(self, head: Head) -> None:
        super().__init__()
        self.norm, self.weight = head.norm, head.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(self.norm(hidden), self.weight)


def _preset_layers(model: str, seed: int) -> list[torch.nn.Module]:
    spec = get_preset(model)
    layers: list[torch.nn.Module] = []
    for index, kind in enumerate(layer_kinds(spec)):
        built = build_layer(spec, kind, layer_index=index, seed=seed)
        layers.append(_Logits(built) if isinstance(built, Head) else built)
    return layers


def run_step(ctx: Any, export: dict[str, Any], model: str, seed: int, lr: float
             ) -> dict[str, Any]:
    """One DeepSpeed `train_batch()` of the export on this process (spawned with
    `profiles.distributed.spawn`): its stage, its layer bounds and its parameters after one
    SGD step, keyed by (layer, name)."""
    os.environ.setdefault("LOCAL_RANK", str(ctx.local_rank))
    # On CPU DeepSpeed would compile its shared-memory all-reduce (a C++ op, tens of seconds
    # on first use); gloo does the same reduction. DeepSpeed keeps this dict for such edits.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")
    topology = ProcessTopology(axes=export["topology"]["axes"], dims=export["topology"]["dims"])
    pipeline_module = export["pipeline_module"]
    module = BoundedPipelineModule(
        _preset_layers(model, seed), stage_bounds=pipeline_module["stage_bounds"],
        topology=topology, loss_fn=_loss,
        activation_checkpoint_interval=pipeline_module.get("activation_checkpoint_interval", 0))
    optimizer = torch.optim.SGD(module.parameters(), lr=lr)
    engine, *_ = deepspeed.initialize(model=module, optimizer=optimizer,
                                      config=export["ds_config"])
    config = export["ds_config"]
    coord = topology.get_coord(ctx.rank)
    micro, steps = config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]
    tokens, labels = global_batch(get_preset(model), config["train_batch_size"], seed=seed, step=0)
    first = coord.data * micro * steps
    batches = iter([(tokens[first + m * micro: first + (m + 1) * micro],
                     labels[first + m * micro: first + (m + 1) * micro]) for m in range(steps)])
    engine.train_batch(data_iter=batches)
    # PipelineModule registers each layer under its global index.
    weights = {(int(name.split(".")[0]), name.partition(".")[2]):
               param.detach().clone() for name, param in module.named_parameters()}
    return {"stage": coord.pipe, "bounds": (module._local_start, module._local_stop),
            "weights": weights}


def _loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), labels.flatten())
