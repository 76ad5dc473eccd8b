"""Send measured rows and links to the hetplan service; no torch.

The service's row and link schemas are strict (unknown fields are refused),
so hetplan's `x_` extensions do not travel in the rows: they are summarised
in the upload's free-form `source` (device, dtype, noisy points, spreads).

Idempotency: the key is a hash of the request body, so re-running the same
upload after a lost answer replays the stored result instead of making a
second version; the client retries connection failures and 5xx answers with
that key. Each request is one transaction on the server, so an upload is
either stored whole or not at all; rows for several GPU types go as one
request per type, and a failure says which types were stored before it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = [
    "ROW_FIELDS",
    "LINK_FIELDS",
    "UploadFailed",
    "UploadResult",
    "idempotency_key",
    "service_row",
    "service_link",
    "row_source",
    "upload_rows",
    "upload_links",
]

ROW_FIELDS = ("gpu_type", "kind", "micro_batch", "tp", "forward_ms", "backward_ms",
              "activation_bytes")
LINK_FIELDS = ("scope", "gpu_type", "zones", "bandwidth_gb_per_s", "latency_us")


class _Client(Protocol):
    """What this module needs of `api.client.HetplanClient`."""

    def upload_profiles(self, model: str, gpu_type: str, rows: list[dict[str, Any]], *,
                        source: dict[str, Any] | None = None,
                        idempotency_key: str | None = None) -> dict[str, Any]: ...

    def upload_links(self, links: list[dict[str, Any]], *,
                     idempotency_key: str | None = None) -> dict[str, Any]: ...


class UploadFailed(RuntimeError):
    """An upload the service did not store; `stored` lists what earlier requests stored."""

    def __init__(self, message: str, *, stored: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.stored = stored


@dataclass(frozen=True, kw_only=True)
class UploadResult:
    """What the service answered for each request of an upload."""

    answers: list[dict[str, Any]] = field(default_factory=list)


def idempotency_key(kind: str, body: Any) -> str:
    """A key that is the same for the same upload, different for any other."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return f"hetplan-{kind}-" + hashlib.sha256(canonical.encode()).hexdigest()[:40]


def service_row(row: dict[str, Any]) -> dict[str, Any]:
    """The fields of a profile row that the service's schema takes."""
    missing = [k for k in ROW_FIELDS if k not in row]
    if missing:
        raise ValueError(f"row {row} lacks {missing}; rows need {list(ROW_FIELDS)}")
    return {k: row[k] for k in ROW_FIELDS}


def service_link(link: dict[str, Any]) -> dict[str, Any]:
    """The fields of a link row that the service's schema takes."""
    return {k: link[k] for k in LINK_FIELDS if k in link}


def row_source(rows: list[dict[str, Any]], **provenance: Any) -> dict[str, Any]:
    """The upload's `source`: provenance plus the per-row extensions the rows cannot carry."""
    labels = sorted({str(r.get("x_source", "unlabelled")) for r in rows})
    devices = sorted({str(r["x_device"]) for r in rows if "x_device" in r})
    extras = [
        {"kind": r["kind"], "micro_batch": r["micro_batch"], "tp": r["tp"],
         **{k: v for k, v in r.items() if k.startswith("x_")}}
        for r in rows
    ]
    return {"x_source": labels[0] if len(labels) == 1 else labels, "devices": devices,
            "rows": extras, **provenance}


def upload_rows(
    client: _Client,
    rows: Iterable[dict[str, Any]],
    *,
    model: str,
    provenance: dict[str, Any] | None = None,
) -> UploadResult:
    """Upload rows as one request per GPU type; `UploadFailed` says what was stored first."""
    by_type: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_type.setdefault(str(row["gpu_type"]), []).append(row)
    if not by_type:
        raise ValueError("no rows to upload; every point may have been skipped")
    answers: list[dict[str, Any]] = []
    for gpu_type, typed in sorted(by_type.items()):
        body_rows = [service_row(r) for r in typed]
        source = row_source(typed, **(provenance or {}))
        key = idempotency_key("profiles", {"model": model, "gpu_type": gpu_type,
                                           "rows": body_rows, "source": source})
        try:
            answers.append(client.upload_profiles(model, gpu_type, body_rows, source=source,
                                                  idempotency_key=key))
        except Exception as error:
            stored = ", ".join(a.get("gpu_type", "?") for a in answers) or "nothing"
            raise UploadFailed(f"upload of {model} on {gpu_type} failed ({error}); "
                               f"stored before it: {stored}", stored=answers) from error
    return UploadResult(answers=answers)


def upload_links(client: _Client, links: Iterable[dict[str, Any]]) -> UploadResult:
    """Upload link rows in one request, so they are stored together or not at all."""
    body = [service_link(link) for link in links]
    if not body:
        raise ValueError("no links to upload")
    try:
        answer = client.upload_links(body, idempotency_key=idempotency_key("links", body))
    except Exception as error:
        raise UploadFailed(f"link upload failed ({error}); nothing was stored",
                           stored=[]) from error
    return UploadResult(answers=[answer])
