"""Tiny scenario builders whose numbers can be worked by hand."""

from __future__ import annotations

import copy
from typing import Any

from planner import SearchOptions, evaluate, parse_plan, parse_scenario
from planner import plan as search


def tiny(**job: Any) -> dict[str, Any]:
    """Two 4-GPU nodes of one type; two layers: kind a (no output), kind b.

    Per micro-batch of 1 at tp 1: a takes 1 ms forward, 2 ms backward; b takes
    2 ms and 4 ms. Layer outputs are 1e6 bytes per sample for b, 0 for a.
    """
    return {
        "format": "hetplan-scenario/1",
        "gpu_types": {"G": {"memory_gib": 10}},
        "cluster": {
            "nodes": [{"name": "n0", "gpu_type": "G", "gpus": 4},
                      {"name": "n1", "gpu_type": "G", "gpus": 4}],
            "intra_node": {"G": {"bandwidth_gb_per_s": 100, "latency_us": 0}},
            "inter_node": {"bandwidth_gb_per_s": 10, "latency_us": 0},
        },
        "model": {
            "name": "tiny", "seq_len": 8, "layers": ["a", "b"],
            "kinds": {"a": {"params": 1_000_000, "output_bytes_per_sample": 0},
                      "b": {"params": 1_000_000, "output_bytes_per_sample": 1_000_000}},
        },
        "profiles": [
            {"gpu_type": "G", "kind": "a", "micro_batch": 1, "tp": 1,
             "forward_ms": 1, "backward_ms": 2, "activation_bytes": 1_000_000},
            {"gpu_type": "G", "kind": "b", "micro_batch": 1, "tp": 1,
             "forward_ms": 2, "backward_ms": 4, "activation_bytes": 2_000_000},
        ],
        "job": {"global_batch_size": 2, **job},
    }


def uniform(**job: Any) -> dict[str, Any]:
    """Like `tiny` but both layers of kind b (1e6 output bytes, 2 ms / 4 ms)."""
    doc = tiny(**job)
    doc["model"]["layers"] = ["b", "b"]
    doc["model"]["kinds"] = {"b": doc["model"]["kinds"]["b"]}
    doc["profiles"] = [dict(doc["profiles"][1], forward_ms=1, backward_ms=2)]
    return doc


def stage(gpus: list[str], layers: tuple[int, int], tp: int = 1) -> dict[str, Any]:
    return {"gpu_type": "G", "tp": tp, "gpus": gpus, "layers": list(layers)}


def pipeline(stages: list[dict[str, Any]], b: int = 1, m: int = 2) -> dict[str, Any]:
    return {"micro_batch_size": b, "num_micro_batches": m, "stages": stages}


def plan(*pipelines: dict[str, Any], schedule: str | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {"format": "hetplan-plan/1", "pipelines": list(pipelines)}
    if schedule:
        doc["schedule"] = schedule
    return copy.deepcopy(doc)


def deep(num_layers: int, **job: Any) -> dict[str, Any]:
    """Like `uniform` with `num_layers` layers of kind b (1 ms forward, 2 ms backward, 1e6
    output bytes and 2e6 activation bytes per sample), and a local-learning head kind h
    (1000 params, no output; 0.5 ms forward, 0.5 ms backward, 5e5 activation bytes) that
    no layer uses."""
    doc = uniform(**job)
    doc["model"]["layers"] = ["b"] * num_layers
    doc["model"]["kinds"]["h"] = {"params": 1000, "output_bytes_per_sample": 0}
    doc["profiles"].append({"gpu_type": "G", "kind": "h", "micro_batch": 1, "tp": 1,
                            "forward_ms": 0.5, "backward_ms": 0.5, "activation_bytes": 500_000})
    return doc


def chunked(gpus: list[str], chunks: list[tuple[int, int]], recompute: bool = False,
            ) -> dict[str, Any]:
    doc: dict[str, Any] = {"gpu_type": "G", "tp": 1, "gpus": gpus,
                           "chunks": [list(c) for c in chunks]}
    if recompute:
        doc["recompute"] = True
    return doc


def with_wan(doc: dict[str, Any], *, gb_per_s: float = 1.25,
             latency_us: float = 10_000.0) -> dict[str, Any]:
    """`doc` with a link between zones a and b (1.25 GB/s and 10 ms unless told)."""
    doc["cluster"]["inter_zone"] = [{"zones": ["a", "b"], "bandwidth_gb_per_s": gb_per_s,
                                     "latency_us": latency_us}]
    return doc


def assert_search_reaches(scenario_doc: dict[str, Any], plan_doc: dict[str, Any]) -> None:
    """The default search's plan of `scenario_doc` runs at least as fast as `plan_doc`, a
    valid plan written out or found another way."""
    scenario = parse_scenario(scenario_doc)
    floor = evaluate(scenario, parse_plan(plan_doc))
    assert floor.valid and floor.samples_per_s is not None, floor.errors
    found = search(scenario, SearchOptions(time_limit_s=10)).evaluation.samples_per_s
    assert found is not None and found >= floor.samples_per_s * (1 - 1e-9)


def copies(scenario_doc: dict[str, Any], count: int) -> dict[str, Any]:
    """`count` copies of every node of `scenario_doc` (named `<node>-c<k>`), the batch
    multiplied to match."""
    doc = copy.deepcopy(scenario_doc)
    doc["cluster"]["nodes"] = [dict(node, name=f"{node['name']}-c{k}") for k in range(count)
                               for node in doc["cluster"]["nodes"]]
    doc["job"]["global_batch_size"] *= count
    return doc


def searched_plan(scenario_doc: dict[str, Any]) -> dict[str, Any]:
    """The default search's plan of `scenario_doc` as a document to lay on another fleet:
    without the estimate and search sections, which describe this one."""
    found = search(parse_scenario(scenario_doc), SearchOptions(time_limit_s=10)).plan
    return found.model_dump(mode="json", exclude_none=True, exclude={"estimate", "search"})


def laid_down_on_copies(scenario_doc: dict[str, Any], count: int) -> dict[str, Any]:
    """The default search's plan of `scenario_doc` laid down once on each of `count` copies
    of its nodes (as `copies` names them): a plan of the larger fleet found another way."""
    doc = searched_plan(scenario_doc)

    def on_copy(gpu: str, k: int) -> str:
        node, _, index = gpu.rpartition(":")
        return f"{node}-c{k}:{index}"

    doc["pipelines"] = [
        {**pipeline, "stages": [{**stage, "gpus": [on_copy(gpu, k) for gpu in stage["gpus"]]}
                                for stage in pipeline["stages"]]}
        for k in range(count) for pipeline in doc["pipelines"]]
    return doc
