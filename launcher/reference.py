"""The single-process runs a launched plan must reproduce.

- `reference_weights`: the whole model on the whole global batch, one optimizer
  step per batch (end-to-end backpropagation: what 1F1B, GPipe, interleaved
  1F1B and recomputation must all reach).
- `local_reference_weights`: local learning on the same blocks. Each block runs
  on the previous block's output, detached, and trains on its own head's loss
  (the model's head for the last block); written on its own, on the whole batch
  with torch.optim, without the launcher's schedule, messages or micro-batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from launcher.data import global_batch
from profiles.models import LOCAL_HEAD
from profiles.torch_layers import build_layer, get_preset, layer_kinds

__all__ = ["reference_weights", "local_reference_weights", "LocalReference"]

Weights = dict[int, dict[str, torch.Tensor]]


def _optimizer(params: list[nn.Parameter], optimizer: Literal["sgd", "adam"], lr: float
               ) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=lr) if optimizer == "adam" else torch.optim.SGD(params, lr=lr)


def _weights(modules: dict[int, nn.Module]) -> Weights:
    return {i: {name: p.detach().clone() for name, p in module.named_parameters()}
            for i, module in modules.items()}


def reference_weights(model: str, global_batch_size: int, *, seed: int = 0, steps: int = 1,
                      optimizer: Literal["sgd", "adam"] = "sgd", lr: float = 0.1
                      ) -> tuple[Weights, list[float]]:
    """Full (TP=1) weights of every layer after `steps` steps, and the loss of each step."""
    spec = get_preset(model)
    kinds = layer_kinds(spec)
    layers = [build_layer(spec, kind, layer_index=i, seed=seed) for i, kind in enumerate(kinds)]
    opt = _optimizer([p for layer in layers for p in layer.parameters()], optimizer, lr)
    losses = []
    for step in range(steps):
        tokens, labels = global_batch(spec, global_batch_size, seed=seed, step=step)
        opt.zero_grad()
        x: torch.Tensor = tokens
        for layer, kind in zip(layers, kinds, strict=True):
            x = layer(x, labels) if kind == "head" else layer(x)
        x.backward()
        opt.step()
        losses.append(x.item())
    return _weights(dict(enumerate(layers))), losses


@dataclass(frozen=True, kw_only=True)
class LocalReference:
    weights: Weights
    """Layer index -> parameter name -> full weights after the last step."""
    heads: Weights
    """Block index -> parameter name -> that block's local head (every block but the last)."""
    losses: list[float]
    """Per step: the model's head loss (the last block's)."""
    local_losses: list[list[float]]
    """Per step: each local head's loss, block by block."""


def local_reference_weights(model: str, global_batch_size: int,
                            blocks: Sequence[tuple[int, int]], *, seed: int = 0, steps: int = 1,
                            optimizer: Literal["sgd", "adam"] = "sgd", lr: float = 0.1
                            ) -> LocalReference:
    """Local learning of `model` cut into `blocks` (consecutive layer ranges covering it)."""
    spec = get_preset(model)
    kinds = layer_kinds(spec)
    layers = [build_layer(spec, kind, layer_index=i, seed=seed) for i, kind in enumerate(kinds)]
    heads = {b: build_layer(spec, LOCAL_HEAD, layer_index=end - 1, seed=seed)
             for b, (_, end) in enumerate(blocks[:-1])}
    modules = [*layers, *heads.values()]
    opt = _optimizer([p for module in modules for p in module.parameters()], optimizer, lr)
    losses, local_losses = [], []
    for step in range(steps):
        tokens, labels = global_batch(spec, global_batch_size, seed=seed, step=step)
        opt.zero_grad()
        x: torch.Tensor = tokens
        step_local = []
        for b, (start, end) in enumerate(blocks):
            x = x.detach()  # no gradient crosses a block boundary
            for index in range(start, end):
                x = layers[index](x, labels) if kinds[index] == "head" else layers[index](x)
            loss = heads[b](x, labels) if b in heads else x
            loss.backward()
            if b in heads:
                step_local.append(loss.item())
        opt.step()
        losses.append(x.item())
        local_losses.append(step_local)
    return LocalReference(weights=_weights(dict(enumerate(layers))), heads=_weights(heads),
                          losses=losses, local_losses=local_losses)
