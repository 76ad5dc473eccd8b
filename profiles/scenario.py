"""Assemble a full scenario document (docs/formats.md) from parts; no torch.

Inputs: a cluster description (the nodes, optionally links and GPU-type
overrides), a model preset, the bundled reference rows, and optionally
measured rows, which replace estimated rows at the same point. The result is
a plain dict that `planner.parse_scenario` accepts; assembly validates it
before returning, so a bad cluster file fails here with the parser's message.

Cluster file (YAML or JSON), either a list of nodes or a mapping:

    nodes:
      - {name: a0, gpu_type: A100-80G, gpus: 8, zone: east}
      - {name: v0, gpu_type: V100-32G, gpus: 8, zone: east, nics: 1}
    inter_node: {bandwidth_gb_per_s: 25, latency_us: 10}       # optional
    inter_zone: [{zones: [east, west], bandwidth_gb_per_s: 2, latency_us: 5000}]
    intra_node: {A100-80G: {bandwidth_gb_per_s: 230, latency_us: 5}}  # optional
    gpu_types: {A100-80G: {hourly_usd: 1.8}}                   # optional overrides
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from planner import parse_scenario
from profiles.estimate import DTYPE_BYTES
from profiles.models import (
    LOCAL_HEAD,
    ModelSpec,
    layer_kinds,
    layer_params,
    output_bytes_per_sample,
)
from profiles.reference import gpu_catalogue, link_defaults, reference_rows

__all__ = ["ClusterError", "assemble_scenario", "merge_rows"]

DEFAULT_GLOBAL_BATCH = 512
ROW_FIELDS = ("gpu_type", "kind", "micro_batch", "tp", "forward_ms", "backward_ms",
              "activation_bytes")


class ClusterError(ValueError):
    """The cluster description cannot be turned into a scenario; the message says why."""


def assemble_scenario(
    cluster: Any,
    spec: ModelSpec,
    *,
    global_batch_size: int = DEFAULT_GLOBAL_BATCH,
    measured_rows: Iterable[dict[str, Any]] = (),
    job: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A validated `hetplan-scenario/1` document for `spec` on `cluster`."""
    cluster = _normalise_cluster(cluster)
    nodes = cluster["nodes"]
    used_types = sorted({n["gpu_type"] for n in nodes})
    gpu_types = _gpu_types(used_types, cluster.get("gpu_types", {}))
    max_tp = {t: max(n["gpus"] for n in nodes if n["gpu_type"] == t) for t in used_types}
    rows = merge_rows(_reference_for(spec, used_types), measured_rows)
    rows = [r for r in rows if r["gpu_type"] in gpu_types and r["tp"] <= max_tp[r["gpu_type"]]]
    if not rows:
        raise ClusterError(
            f"no profile rows for {spec.name} on {used_types}; pass measured rows "
            f"(hetplan profile layers -o rows.json, then --profiles rows.json) or use a model "
            f"with reference rows"
        )
    document = {
        "format": "hetplan-scenario/1",
        "gpu_types": gpu_types,
        "cluster": _links(cluster, used_types),
        "model": _model(spec, rows, local_head=(job or {}).get("local_head_kind") == LOCAL_HEAD),
        "profiles": rows,
        "job": {"global_batch_size": global_batch_size, **(job or {})},
    }
    parse_scenario(document)  # raises InvalidScenario listing every problem
    return document


def _normalise_cluster(cluster: Any) -> dict[str, Any]:
    if isinstance(cluster, list):
        cluster = {"nodes": cluster}
    if not isinstance(cluster, dict) or not isinstance(cluster.get("nodes"), list):
        raise ClusterError("the cluster file must be a list of nodes or a mapping with 'nodes': "
                           "[{name, gpu_type, gpus, zone?, nics?}, ...]")
    if not cluster["nodes"]:
        raise ClusterError("the cluster has no nodes; list at least one")
    for i, node in enumerate(cluster["nodes"]):
        missing = [k for k in ("name", "gpu_type", "gpus") if not isinstance(node, dict)
                   or k not in node]
        if missing:
            raise ClusterError(f"nodes[{i}] lacks {missing}; each node needs name, gpu_type, gpus")
        gpus = node["gpus"]
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
            raise ClusterError(f"nodes[{i}] ({node['name']!r}) has gpus: {gpus!r}; a node needs a "
                               "whole number of GPUs, at least 1: fix it or leave the node out")
    return cluster


def _gpu_types(used: list[str], overrides: dict[str, Any]) -> dict[str, Any]:
    catalogue = gpu_catalogue()["gpu_types"]
    types = {}
    for name in used:
        base = catalogue.get(name)
        if base is None and "memory_gib" not in overrides.get(name, {}):
            raise ClusterError(
                f"GPU type {name!r} is not in the reference catalogue {sorted(catalogue)}; "
                "rename it to one of those, or declare it under gpu_types with memory_gib "
                "and pass measured rows for it"
            )
        entry = {"memory_gib": base["memory_gib"], "peak_tflops": base["peak_tflops"]} if base \
            else {}
        types[name] = {**entry, **overrides.get(name, {})}
    return types


def _links(cluster: dict[str, Any], used: list[str]) -> dict[str, Any]:
    defaults = link_defaults()
    intra = {t: defaults["intra_node"][t] for t in used if t in defaults["intra_node"]}
    intra.update(cluster.get("intra_node", {}))
    out: dict[str, Any] = {
        "nodes": cluster["nodes"],
        "intra_node": intra,
        "inter_node": cluster.get("inter_node", defaults["inter_node"]),
    }
    zones = sorted({n["zone"] for n in cluster["nodes"] if n.get("zone") is not None})
    if "inter_zone" in cluster:
        out["inter_zone"] = cluster["inter_zone"]
    elif len(zones) > 1:
        # Different zones without a stated link: assume the wide-area default
        # rather than silently treating them as one fabric.
        wan = defaults["inter_zone"]
        out["inter_zone"] = [{"zones": [a, b], **wan} for i, a in enumerate(zones)
                             for b in zones[i + 1:]]
    return out


def _reference_for(spec: ModelSpec, used: list[str]) -> list[dict[str, Any]]:
    try:
        rows = reference_rows(spec.name)
    except KeyError:
        return []  # a model without reference rows needs measured ones; the parser says so
    return [r for r in rows if r["gpu_type"] in used]


def merge_rows(
    estimated: Iterable[dict[str, Any]], measured: Iterable[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Estimated rows, with any measured row replacing the estimate at its point."""
    by_point: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in estimated:
        by_point[_point(row)] = row
    for row in measured:
        missing = [k for k in ROW_FIELDS if k not in row]
        if missing:
            raise ClusterError(f"measured row {row} lacks {missing}")
        by_point[_point(row)] = row
    return sorted(by_point.values(), key=_point)


def _point(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["gpu_type"], row["kind"], row["micro_batch"], row["tp"])


def _model(spec: ModelSpec, rows: list[dict[str, Any]], *, local_head: bool) -> dict[str, Any]:
    """The model section; `local_head`: the job trains through local heads (schedule local), so
    their kind is declared too (it is in no position of `layers`)."""
    # Hand-off sizes follow the dtype the rows were profiled in (bf16 on GPU).
    dtypes = {r.get("x_dtype", "bfloat16") for r in rows}
    dtype_bytes = max((DTYPE_BYTES.get(d, 2) for d in dtypes), default=2)
    kinds = layer_kinds(spec)
    declared = kinds + [LOCAL_HEAD] if local_head else kinds
    return {
        "name": spec.name,
        "seq_len": spec.seq_len,
        "layers": kinds,
        "kinds": {
            kind: {"params": layer_params(spec, kind),
                   "output_bytes_per_sample": output_bytes_per_sample(
                       spec, kind, dtype_bytes=dtype_bytes)}
            for kind in dict.fromkeys(declared)
        },
    }
