"""The single-process run a launched plan must reproduce: the whole model on the whole
global batch, one optimizer step per batch."""

from __future__ import annotations

from typing import Literal

import torch

from launcher.data import global_batch
from profiles.torch_layers import build_layer, get_preset, layer_kinds

__all__ = ["reference_weights"]


def reference_weights(model: str, global_batch_size: int, *, seed: int = 0, steps: int = 1,
                      optimizer: Literal["sgd", "adam"] = "sgd", lr: float = 0.1
                      ) -> tuple[dict[int, dict[str, torch.Tensor]], list[float]]:
    """Full (TP=1) weights of every layer after `steps` steps, and the loss of each step."""
    spec = get_preset(model)
    kinds = layer_kinds(spec)
    layers = [build_layer(spec, kind, layer_index=i, seed=seed) for i, kind in enumerate(kinds)]
    params = [p for layer in layers for p in layer.parameters()]
    opt = (torch.optim.Adam(params, lr=lr) if optimizer == "adam"
           else torch.optim.SGD(params, lr=lr))
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
    weights = {i: {name: p.detach().clone() for name, p in layer.named_parameters()}
               for i, layer in enumerate(layers)}
    return weights, losses
