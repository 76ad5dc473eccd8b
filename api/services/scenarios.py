"""Assemble a scenario document from a request: whole, or from stored and inline pieces.

The result records where each piece came from (`sources`), with versions, so a stored
plan says exactly which profiles, links, model and cluster it was computed from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import planner
from api import schemas
from api.errors import InvalidRequest, NotFound
from api.storage import Catalogue, Store
from planner.errors import Problem

__all__ = ["Assembled", "assemble"]


@dataclass(frozen=True, kw_only=True)
class Assembled:
    scenario: planner.Scenario
    document: dict[str, Any]
    """The scenario as a JSON document, as the planner saw it."""
    sources: dict[str, Any]


def assemble(source: schemas.ScenarioSource, store: Store) -> Assembled:
    """A validated scenario from `source`; `InvalidRequest` for unknown or missing pieces,
    `planner.InvalidScenario` when the assembled document breaks a rule."""
    if source.scenario is not None:
        extra = [f for f in ("cluster", "model", "job", "gpu_types", "profile_versions",
                             "links_version") if getattr(source, f) is not None]
        if extra:
            raise InvalidRequest(
                f"give either a whole `scenario` or its pieces, not both (also got {extra})")
        scenario = planner.parse_scenario(source.scenario)
        return Assembled(scenario=scenario, document=source.scenario,
                         sources={"scenario": "inline"})
    missing = [Problem(path=f, message="required unless a whole `scenario` is given")
               for f in ("cluster", "model", "job") if getattr(source, f) is None]
    if missing:
        raise InvalidRequest("the request has no scenario: give `scenario`, or `cluster`, "
                             "`model` and `job`", problems=missing)
    assert source.cluster is not None and source.model is not None and source.job is not None
    sources: dict[str, Any] = {}
    cluster, sources["cluster"] = _resolve(store, Catalogue.CLUSTER, source.cluster)
    model, sources["model"] = _resolve(store, Catalogue.MODEL, source.model)
    gpu_types, sources["gpu_types"] = _gpu_types(store, source, cluster)
    links, sources["links"] = _links(store, source, cluster, set(gpu_types))
    profiles, sources["profiles"] = _profiles(store, source, model["name"], set(gpu_types))
    document = {
        "format": "hetplan-scenario/1",
        "gpu_types": gpu_types,
        "cluster": {"nodes": cluster["nodes"], **links},
        "model": {k: model[k] for k in ("name", "seq_len", "layers", "kinds")},
        "profiles": profiles,
        "job": source.job.model_dump(mode="json"),
    }
    scenario = planner.parse_scenario(document)
    return Assembled(scenario=scenario, document=document, sources=sources)


def _resolve(store: Store, kind: Catalogue, ref: Any) -> tuple[dict[str, Any], Any]:
    """(document with its name, source) of a name, a {name, version} or an inline body."""
    if isinstance(ref, schemas.StoredRef | str):
        name, version = (ref, None) if isinstance(ref, str) else (ref.name, ref.version)
        try:
            record = store.get_document(kind, name, version)
        except NotFound as error:
            raise InvalidRequest(error.message, problems=[
                Problem(path=kind.value, message="unknown reference", value=name)]) from None
        return {"name": record.name, **record.document}, {"name": record.name,
                                                          "version": record.version}
    return ref.model_dump(mode="json", exclude_none=True), "inline"


def _gpu_types(store: Store, source: schemas.ScenarioSource, cluster: dict[str, Any]
               ) -> tuple[dict[str, Any], dict[str, Any]]:
    inline = source.gpu_types or {}
    found: dict[str, Any] = {}
    sources: dict[str, Any] = {}
    problems = []
    for gpu_type in sorted({node["gpu_type"] for node in cluster["nodes"]}):
        if gpu_type in inline:
            found[gpu_type] = inline[gpu_type].model_dump(mode="json", exclude_none=True,
                                                          exclude={"name"})
            sources[gpu_type] = "inline"
            continue
        try:
            record = store.get_document(Catalogue.GPU_TYPE, gpu_type)
        except NotFound:
            problems.append(Problem(path=f"gpu_types.{gpu_type}", message="GPU type used by the "
                                    "cluster is not registered (POST /v1/gpu-types)"))
            continue
        found[gpu_type] = record.document
        sources[gpu_type] = {"version": record.version}
    if problems:
        raise InvalidRequest("the cluster uses unknown GPU types", problems=problems)
    return found, sources


def _links(store: Store, source: schemas.ScenarioSource, cluster: dict[str, Any],
           gpu_types: set[str]) -> tuple[dict[str, Any], Any]:
    """The cluster's own links, completed from the link catalogue where it has none."""
    own: dict[str, Any] = {k: cluster[k] for k in ("intra_node", "inter_node", "inter_zone") if k in cluster}
    needs_catalogue = "inter_node" not in own or not gpu_types <= set(own.get("intra_node", {}))
    if not needs_catalogue:
        return own, "cluster"
    record = store.get_link_set(source.links_version)
    if record is None:
        at = "" if source.links_version is None else f" at version {source.links_version}"
        raise InvalidRequest(f"the cluster has no links of its own and no link catalogue is "
                             f"stored{at}; upload measured links with POST /v1/links")
    catalogue: dict[str, Any] = {"intra_node": {}, "inter_zone": []}
    for link in record.links:
        value = {"bandwidth_gb_per_s": link.bandwidth_gb_per_s, "latency_us": link.latency_us}
        if link.scope == "intra_node" and link.gpu_type in gpu_types:
            catalogue["intra_node"][link.gpu_type] = value
        elif link.scope == "inter_node":
            catalogue["inter_node"] = value
        elif link.scope == "inter_zone":
            catalogue["inter_zone"].append({"zones": list(link.zones or ()), **value})
    links = {
        "intra_node": {**catalogue["intra_node"], **own.get("intra_node", {})},
        "inter_zone": own.get("inter_zone", catalogue["inter_zone"]),
    }
    inter_node = own.get("inter_node", catalogue.get("inter_node"))
    problems = [Problem(path=f"cluster.intra_node.{g}", message="no intra_node link measured "
                        "for this GPU type; upload one with POST /v1/links")
                for g in sorted(gpu_types - set(links["intra_node"]))]
    if inter_node is None:
        problems.append(Problem(path="cluster.inter_node", message="no inter_node link "
                                "measured; upload one with POST /v1/links"))
    if problems:
        raise InvalidRequest("links are missing for the cluster", problems=problems)
    links["inter_node"] = inter_node
    return links, {"version": record.version}


def _profiles(store: Store, source: schemas.ScenarioSource, model: str, gpu_types: set[str]
              ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    pinned = source.profile_versions or {}
    unknown = sorted(set(pinned) - gpu_types)
    if unknown:
        raise InvalidRequest(f"profile_versions names GPU types {unknown} that the cluster "
                             f"does not use ({sorted(gpu_types)})")
    rows: list[dict[str, Any]] = []
    sources: dict[str, Any] = {}
    problems = []
    for gpu_type in sorted(gpu_types):
        record = store.find_profile_set(model, gpu_type, pinned.get(gpu_type))
        if record is None:
            if gpu_type in pinned:
                problems.append(Problem(path=f"profile_versions.{gpu_type}",
                                        value=pinned[gpu_type],
                                        message=f"no such version of the {model!r} profiles"))
            continue
        sources[gpu_type] = {"id": record.id, "version": record.version}
        rows.extend({"gpu_type": gpu_type, "kind": p.kind, "micro_batch": p.micro_batch,
                     "tp": p.tp, "forward_ms": p.forward_ms, "backward_ms": p.backward_ms,
                     "activation_bytes": p.activation_bytes} for p in record.rows)
    if problems:
        raise InvalidRequest("pinned profile versions are not stored", problems=problems)
    if not rows:
        raise InvalidRequest(
            f"no profiles of model {model!r} are stored for the cluster's GPU types "
            f"{sorted(gpu_types)}; upload them with POST /v1/profiles")
    return rows, sources
