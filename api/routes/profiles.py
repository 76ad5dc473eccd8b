"""Profiles: batches of measured rows per (model, GPU type), versioned on every upload."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Query, Response

from api import schemas
from api.deps import IdempotencyKey, ReadAuth, StoreDep, UploadAuth
from api.errors import ErrorResponses
from api.examples import openapi_examples
from api.routing import CheckedRoute
from api.schemas import NAME_PATTERN
from api.services import catalogue

router = APIRouter(prefix="/v1/profiles", tags=["profiles"], responses=ErrorResponses.common,
                   route_class=CheckedRoute)

Filter = Annotated[str | None, Query(min_length=1, max_length=200, pattern=NAME_PATTERN)]
Limit = Annotated[int, Query(ge=1, le=1000)]
Offset = Annotated[int, Query(ge=0, le=2**31 - 1)]


@router.post("", status_code=201, response_model=schemas.ProfileSetPublic,
             responses=ErrorResponses.upload, operation_id="upload_profiles",
             summary="Upload profile rows of one model on one GPU type")
def upload(body: Annotated[schemas.ProfileCreate, Body(openapi_examples=openapi_examples(
               "/v1/profiles"))], store: StoreDep, _: UploadAuth, response: Response,
           idempotency_key: IdempotencyKey = None) -> dict[str, Any]:
    """Makes a new version: the previous version's rows, with the uploaded points replacing
    the ones they repeat (`replaced` counts them). Nothing is merged or changed in place."""
    record = catalogue.upload_profiles(store, body, idempotency_key)
    response.headers["Location"] = f"/v1/profiles/sets/{record.id}"
    if record.replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return catalogue.profile_set_public(record, with_rows=False)


@router.get("", response_model=schemas.Page[schemas.ProfileRowPublic],
            operation_id="list_profile_rows",
            summary="Rows of the newest profiles, filtered by model, GPU type and kind")
def list_rows(store: StoreDep, _: ReadAuth, model: Filter = None, gpu_type: Filter = None,
              kind: Filter = None, limit: Limit = 1000, offset: Offset = 0) -> dict[str, Any]:
    rows, count = catalogue.profile_rows(store, model=model, gpu_type=gpu_type, kind=kind,
                                         limit=limit, offset=offset)
    return {"data": rows, "count": count}


@router.get("/sets", response_model=schemas.Page[schemas.ProfileSetPublic],
            operation_id="list_profile_sets", summary="Profile versions, newest first")
def list_sets(store: StoreDep, _: ReadAuth, model: Filter = None, gpu_type: Filter = None,
              limit: Limit = 100, offset: Offset = 0) -> dict[str, Any]:
    records, count = store.list_profile_sets(model=model, gpu_type=gpu_type, limit=limit,
                                             offset=offset)
    return {"data": [catalogue.profile_set_public(r, with_rows=False) for r in records],
            "count": count}


@router.get("/sets/{set_id}", response_model=schemas.ProfileSetPublic,
            responses=ErrorResponses.not_found, operation_id="get_profile_set",
            summary="One profile version with a page of its rows")
def get_set(set_id: Annotated[int, Path(ge=1, le=2**31 - 1)], store: StoreDep,
            _: ReadAuth, limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000,
            offset: Offset = 0) -> dict[str, Any]:
    """`rows` holds the version's rows from `offset` on, at most `limit`, by (kind,
    micro_batch, tp); `count` is the number of rows in the version."""
    record = store.get_profile_set(set_id, limit=limit, offset=offset)
    return catalogue.profile_set_public(record, with_rows=True)


@router.get("/coverage", response_model=schemas.CoveragePublic,
            operation_id="profile_coverage",
            summary="Which (kind, micro_batch, tp) points the newest profiles cover")
def coverage(store: StoreDep, _: ReadAuth, model: Filter = None,
             gpu_type: Filter = None) -> dict[str, Any]:
    return {"data": catalogue.coverage(store, model=model, gpu_type=gpu_type)}
