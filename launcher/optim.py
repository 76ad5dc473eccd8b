"""SGD and Adam written out, for the launcher's workers.

Why not torch.optim: constructing the first torch.optim optimizer in a process
costs about 1.7 s on this machine (it loads the compiler stack), paid by every
spawned worker of every launch. These are the textbook updates (Adam as in
Kingma & Ba 2015, with bias correction and torch's defaults), and the
equivalence test checks them against torch.optim in the reference run.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["Sgd", "Adam"]


class Sgd:
    def __init__(self, params: Sequence[nn.Parameter], *, lr: float) -> None:
        self.params, self.lr = list(params), lr

    @torch.no_grad()
    def step(self) -> None:
        for param in self.params:
            if param.grad is not None:
                param.add_(param.grad, alpha=-self.lr)


class Adam:
    def __init__(self, params: Sequence[nn.Parameter], *, lr: float, betas: tuple[float, float] = (
            0.9, 0.999), eps: float = 1e-8) -> None:
        self.params, self.lr, self.betas, self.eps = list(params), lr, betas, eps
        self.moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in self.params]
        self.num_steps = 0

    @torch.no_grad()
    def step(self) -> None:
        self.num_steps += 1
        beta1, beta2 = self.betas
        first_correction = 1 - beta1**self.num_steps
        second_correction = 1 - beta2**self.num_steps
        for param, (mean, square) in zip(self.params, self.moments, strict=True):
            if param.grad is None:
                continue
            mean.mul_(beta1).add_(param.grad, alpha=1 - beta1)
            square.mul_(beta2).addcmul_(param.grad, param.grad, value=1 - beta2)
            denominator = (square / second_correction).sqrt_().add_(self.eps)
            param.addcdiv_(mean, denominator, value=-self.lr / first_correction)
