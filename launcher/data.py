"""The training data of a launched plan: random tokens, the same for every layout.

Every process draws the whole global batch of a step from a generator seeded by
(seed, step) and keeps its pipeline's slice, so a plan and a single process
see the same samples without any data loading or broadcast.
"""

from __future__ import annotations

import torch

from profiles.models import ModelSpec

__all__ = ["global_batch"]


def global_batch(spec: ModelSpec, global_batch_size: int, *, seed: int, step: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and next-token labels, each `[global_batch_size, seq_len]`."""
    generator = torch.Generator(device="cpu")
    generator.manual_seed(seed * 1_000_003 + step)
    tokens = torch.randint(0, spec.vocab_size, (global_batch_size, spec.seq_len + 1),
                           generator=generator)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
