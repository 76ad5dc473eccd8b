"""Uploads: turn validated request bodies into store writes, and records into answers."""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from typing import Any

from pydantic import BaseModel

from api import schemas
from api.errors import InvalidRequest, NotFound
from api.storage import Catalogue, LinkSetRecord, ProfileSetRecord, Store, Versioned
from api.storage.store import LinkRow, ProfilePoint
from planner.errors import Problem

__all__ = [
    "body_sha256",
    "register",
    "versioned_public",
    "upload_profiles",
    "profile_set_public",
    "coverage",
    "upload_links",
    "link_set_public",
]


def body_sha256(body: BaseModel) -> str:
    """Digest of a body's meaning (key order and whitespace ignored), for Idempotency-Key."""
    canonical = json.dumps(body.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def register(store: Store, kind: Catalogue, body: BaseModel) -> Versioned:
    """Store a GPU type, model or cluster as the next version of its name."""
    document = body.model_dump(mode="json", exclude_none=True)
    name = document.pop("name")
    if kind is Catalogue.CLUSTER:
        _check_cluster_gpu_types(store, document)
    return store.put_document(kind, name, document)


def _check_cluster_gpu_types(store: Store, document: dict[str, Any]) -> None:
    """A cluster may only name GPU types that are registered (unknown reference: 422)."""
    unknown = []
    for i, node in enumerate(document["nodes"]):
        try:
            store.get_document(Catalogue.GPU_TYPE, node["gpu_type"])
        except NotFound:
            unknown.append(Problem(path=f"nodes[{i}].gpu_type", value=node["gpu_type"],
                                   message="no GPU type of this name is registered; register "
                                           "it first with POST /v1/gpu-types"))
    if unknown:
        named = ", ".join(f"{p.path} {p.value!r}" for p in unknown)
        raise InvalidRequest(
            f"the cluster names GPU types that are not registered: {named}; "
            "register them first with POST /v1/gpu-types", problems=unknown)


def versioned_public(record: Versioned) -> dict[str, Any]:
    return {"id": record.id, "name": record.name, "version": record.version,
            "created_at": record.created_at, **record.document}


def upload_profiles(store: Store, body: schemas.ProfileCreate,
                    idempotency_key: str | None) -> ProfileSetRecord:
    rows = [ProfilePoint(kind=r.kind, micro_batch=r.micro_batch, tp=r.tp,
                         forward_ms=r.forward_ms, backward_ms=r.backward_ms,
                         activation_bytes=r.activation_bytes) for r in body.rows]
    return store.add_profile_set(model=body.model, gpu_type=body.gpu_type, rows=rows,
                                 source=body.source, body_sha256=body_sha256(body),
                                 idempotency_key=idempotency_key)


def profile_set_public(record: ProfileSetRecord, *, with_rows: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": record.id, "model": record.model, "gpu_type": record.gpu_type,
        "version": record.version, "count": record.row_count,
        "uploaded": record.uploaded_count, "replaced": record.replaced_count,
        "source": record.source, "created_at": record.created_at}
    if with_rows:
        out["rows"] = [_point(p) for p in record.rows]
    return out


def _point(p: ProfilePoint) -> dict[str, Any]:
    return {"kind": p.kind, "micro_batch": p.micro_batch, "tp": p.tp,
            "forward_ms": p.forward_ms, "backward_ms": p.backward_ms,
            "activation_bytes": p.activation_bytes, "uploaded": p.uploaded}


def profile_rows(store: Store, *, model: str | None, gpu_type: str | None,
                 kind: str | None, limit: int, offset: int) -> tuple[list[dict[str, Any]], int]:
    """One page of the rows of the newest profile version of each (model, GPU type),
    filtered, and how many rows match."""
    rows, count = store.newest_profile_rows(model=model, gpu_type=gpu_type, kind=kind,
                                            limit=limit, offset=offset)
    return [{"model": r.model, "gpu_type": r.gpu_type, "version": r.version, **_point(r.point)}
            for r in rows], count


def coverage(store: Store, *, model: str | None, gpu_type: str | None) -> list[dict[str, Any]]:
    """Which (kind, micro_batch, tp) points the newest profiles cover, and what is missing."""
    sets, _ = store.list_profile_sets(model=model, gpu_type=gpu_type, newest_only=True,
                                      limit=10_000)
    entries = []
    for summary in sets:
        record = store.find_profile_set(summary.model, summary.gpu_type, summary.version)
        assert record is not None
        points: dict[str, set[tuple[int, int]]] = defaultdict(set)
        for p in record.rows:
            points[p.kind].add((p.micro_batch, p.tp))
        try:
            kinds = set(store.get_document(Catalogue.MODEL, record.model).document["layers"])
        except NotFound:
            kinds = set(points)
        shared = set.intersection(*(points.get(k, set()) for k in kinds)) if kinds else set()
        entries.append({
            "model": record.model, "gpu_type": record.gpu_type, "version": record.version,
            "points": {k: sorted(v) for k, v in sorted(points.items())},
            "complete_points": sorted(shared),
            "missing_kinds": sorted(kinds - set(points)),
        })
    return entries


def upload_links(store: Store, body: schemas.LinksCreate,
                 idempotency_key: str | None) -> LinkSetRecord:
    links = [LinkRow(scope=link.scope.value, gpu_type=link.gpu_type, zones=link.zones,
                     bandwidth_gb_per_s=link.bandwidth_gb_per_s, latency_us=link.latency_us)
             for link in body.links]
    return store.add_link_set(links=links, body_sha256=body_sha256(body),
                              idempotency_key=idempotency_key)


def link_set_public(record: LinkSetRecord) -> dict[str, Any]:
    return {
        "id": record.id, "version": record.version, "count": record.row_count,
        "uploaded": record.uploaded_count, "replaced": record.replaced_count,
        "created_at": record.created_at,
        "links": [{"scope": link.scope, "gpu_type": link.gpu_type, "zones": link.zones,
                   "bandwidth_gb_per_s": link.bandwidth_gb_per_s,
                   "latency_us": link.latency_us, "uploaded": link.uploaded}
                  for link in record.links],
    }
