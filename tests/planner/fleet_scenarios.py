"""Priced scenarios small enough to plan by hand, for the money questions of planner.fleet."""

from __future__ import annotations

from typing import Any


def priced(fast_nodes: int = 1, slow_nodes: int = 1) -> dict[str, Any]:
    """One-GPU nodes of a fast type F ($4/hour) and a slow type S ($1/hour); one layer of
    kind b (1e6 params). At micro-batch 1: F takes 1 ms forward and 2 ms backward, S twice
    that. The global batch is 4 samples, so one F GPU alone runs 4 micro-batches of 3 ms,
    12 ms: 333.33 samples/s at $4/hour; one S GPU alone 24 ms, 166.67 samples/s at $1/hour.
    """
    nodes = ([{"name": f"f{i}", "gpu_type": "F", "gpus": 1} for i in range(fast_nodes)]
             + [{"name": f"s{i}", "gpu_type": "S", "gpus": 1} for i in range(slow_nodes)])
    return {
        "format": "hetplan-scenario/1",
        "gpu_types": {"F": {"memory_gib": 10, "hourly_usd": 4.0},
                      "S": {"memory_gib": 10, "hourly_usd": 1.0}},
        "cluster": {"nodes": nodes, "inter_node": {"bandwidth_gb_per_s": 10, "latency_us": 0},
                    "intra_node": {t: {"bandwidth_gb_per_s": 100, "latency_us": 0}
                                   for t in ("F", "S")}},
        "model": {"name": "one-layer", "seq_len": 8, "layers": ["b"],
                  "kinds": {"b": {"params": 1_000_000, "output_bytes_per_sample": 1_000_000}}},
        "profiles": [
            {"gpu_type": "F", "kind": "b", "micro_batch": 1, "tp": 1,
             "forward_ms": 1, "backward_ms": 2, "activation_bytes": 1_000_000},
            {"gpu_type": "S", "kind": "b", "micro_batch": 1, "tp": 1,
             "forward_ms": 2, "backward_ms": 4, "activation_bytes": 1_000_000},
        ],
        "job": {"global_batch_size": 4},
    }
