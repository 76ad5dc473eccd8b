"""Links: measured bandwidth and latency within nodes, between nodes and between zones."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Response

from api import schemas
from api.deps import IdempotencyKey, ReadAuth, StoreDep, UploadAuth
from api.errors import ErrorResponses, NotFound
from api.examples import openapi_examples
from api.routing import CheckedRoute
from api.services import catalogue

router = APIRouter(prefix="/v1/links", tags=["links"], responses=ErrorResponses.common,
                   route_class=CheckedRoute)


@router.post("", status_code=201, response_model=schemas.LinkSetPublic,
             responses=ErrorResponses.upload, operation_id="upload_links",
             summary="Upload measured links (a new version of the link catalogue)")
def upload(body: Annotated[schemas.LinksCreate, Body(openapi_examples=openapi_examples(
               "/v1/links"))], store: StoreDep, _: UploadAuth, response: Response,
           idempotency_key: IdempotencyKey = None) -> dict[str, Any]:
    record = catalogue.upload_links(store, body, idempotency_key)
    response.headers["Location"] = f"/v1/links?version={record.version}"
    if record.replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return catalogue.link_set_public(record)


@router.get("", response_model=schemas.LinkSetPublic, responses=ErrorResponses.not_found,
            operation_id="get_links", summary="The link catalogue (default: newest version)")
def get(store: StoreDep, _: ReadAuth,
        version: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None) -> dict[str, Any]:
    record = store.get_link_set(version)
    if record is None:
        raise NotFound("no links are stored" + ("" if version is None else
                                                 f" at version {version}") +
                       "; upload them with POST /v1/links")
    return catalogue.link_set_public(record)
