"""Swagger UI (`/docs`) and ReDoc (`/redoc`) that work without internet: their scripts,
styles and icon are served by this app from the `fastapi-offline` package, which ships
the released bundles, instead of FastAPI's default CDN links (air-gapped clusters)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from api.route_table import add_routes

__all__ = ["install_offline_docs", "ASSETS_URL"]

ASSETS_URL = "/static/docs"
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"


def _assets_dir() -> Path:
    return Path(str(files("fastapi_offline") / "static"))


def install_offline_docs(app: FastAPI) -> None:
    """Serve /docs, /redoc and their assets on `app` (created with docs_url=redoc_url=None)."""
    openapi_url = app.openapi_url or "/openapi.json"
    router = APIRouter(include_in_schema=False)

    @router.get("/docs")
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{openapi_url}", title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{root}{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
            oauth2_redirect_url=f"{root}{OAUTH2_REDIRECT_URL}")

    @router.get(OAUTH2_REDIRECT_URL)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @router.get("/redoc")
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(
            openapi_url=f"{root}{openapi_url}", title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{ASSETS_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{ASSETS_URL}/favicon.png", with_google_fonts=False)

    add_routes(app, router)
    app.mount(ASSETS_URL, StaticFiles(directory=_assets_dir()), name="docs-assets")
