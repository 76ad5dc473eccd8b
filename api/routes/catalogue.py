"""GPU types, models and clusters: named documents, a new version on every POST.

(No `from __future__ import annotations` here: the routes are built in a function and
FastAPI must see their body types as objects, not as names to look up.)
"""

from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Body, Path, Query, Response
from pydantic import BaseModel

from api import schemas
from api.deps import ReadAuth, StoreDep, UploadAuth
from api.errors import ErrorResponses
from api.examples import openapi_examples
from api.routing import CheckedRoute
from api.schemas import NAME_PATTERN
from api.services.catalogue import register, versioned_public
from api.storage import Catalogue

__all__ = ["gpu_types", "models", "clusters"]

NamePath = Annotated[str, Path(min_length=1, max_length=200, pattern=NAME_PATTERN)]
VersionQuery = Annotated[int | None, Query(ge=1, le=2**31 - 1, description="Default: the newest.")]
Limit = Annotated[int, Query(ge=1, le=1000)]
Offset = Annotated[int, Query(ge=0, le=2**31 - 1)]


def _router(kind: Catalogue, prefix: str, tag: str, body_model: type[BaseModel],
            public: type[BaseModel]) -> APIRouter:
    router = APIRouter(prefix=prefix, tags=[tag], responses=ErrorResponses.common,
                       route_class=CheckedRoute)
    examples = openapi_examples(prefix)

    @router.post("", status_code=201, response_model=public,
                 responses=ErrorResponses.upload, operation_id=f"create_{kind.value}",
                 summary=f"Register a {tag[:-1]} (a new version if the name exists)")
    def create(body: Annotated[body_model, Body(openapi_examples=examples)],  # type: ignore[valid-type]
               store: StoreDep, _: UploadAuth,
               response: Response) -> dict[str, Any]:
        record = register(store, kind, body)
        response.headers["Location"] = f"{prefix}/{quote(record.name, safe='')}?version={record.version}"
        return versioned_public(record)

    page: Any = schemas.Page[public]  # type: ignore[valid-type]

    @router.get("", response_model=page, operation_id=f"list_{kind.value}s",
                summary=f"The newest version of every {tag[:-1]}")
    def list_all(store: StoreDep, _: ReadAuth, limit: Limit = 100, offset: Offset = 0
                 ) -> dict[str, Any]:
        records, count = store.list_documents(kind, limit=limit, offset=offset)
        return {"data": [versioned_public(r) for r in records], "count": count}

    # `:path`: a name may hold '/', which its Location sends as %2F and the server decodes
    @router.get("/{name:path}", response_model=public, operation_id=f"get_{kind.value}",
                responses=ErrorResponses.not_found, summary=f"One {tag[:-1]}")
    def get_one(name: NamePath, store: StoreDep, _: ReadAuth,
                version: VersionQuery = None) -> dict[str, Any]:
        return versioned_public(store.get_document(kind, name, version))

    return router


gpu_types = _router(Catalogue.GPU_TYPE, "/v1/gpu-types", "gpu types", schemas.GpuTypeCreate,
                    schemas.GpuTypePublic)
models = _router(Catalogue.MODEL, "/v1/models", "models", schemas.ModelCreate,
                 schemas.ModelPublic)
clusters = _router(Catalogue.CLUSTER, "/v1/clusters", "clusters", schemas.ClusterCreate,
                   schemas.ClusterPublic)
