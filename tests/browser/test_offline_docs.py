"""Swagger UI and ReDoc work with the network cut: every operation renders, nothing is
fetched from beyond the server, and "Try it out" really calls the API."""

from __future__ import annotations

import httpx

from tests.browser.conftest import LiveServer, OfflinePage

TIMEOUT_MS = 30_000
REDOCLY_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"


def operation_ids(server: LiveServer) -> list[str]:
    document = httpx.get(f"{server.url}/openapi.json").json()
    return [operation["operationId"] for path in document["paths"].values()
            for operation in path.values()]


def rendered_count(offline_page: OfflinePage, url: str, selector: str) -> int:
    """How many `selector` elements the page at `url` shows once the first has rendered."""
    offline_page.page.goto(url)
    offline_page.page.wait_for_selector(selector, timeout=TIMEOUT_MS)
    return int(offline_page.page.locator(selector).count())


def test_swagger_ui_renders_every_operation_offline(live_server: LiveServer,
                                                    offline_page: OfflinePage) -> None:
    rendered = rendered_count(offline_page, f"{live_server.url}/docs", ".opblock")
    assert rendered == len(operation_ids(live_server))
    assert offline_page.blocked == []
    assert offline_page.console_errors == []


def test_try_it_out_registers_the_example_gpu_type(live_server: LiveServer,
                                                   offline_page: OfflinePage) -> None:
    page = offline_page.page
    page.goto(f"{live_server.url}/docs")
    path = page.locator(".opblock-summary-path[data-path='/v1/gpu-types']")
    operation = page.locator(".opblock-post", has=path)
    operation.locator(".opblock-summary").click(timeout=TIMEOUT_MS)
    operation.get_by_role("button", name="Try it out").click()
    operation.get_by_role("button", name="Execute").click()
    status = operation.locator(".live-responses-table tbody .response-col_status").first
    status.wait_for(timeout=TIMEOUT_MS)
    assert status.inner_text().strip() == "201"
    stored = httpx.get(f"{live_server.url}/v1/gpu-types").json()
    assert stored["count"] == 1
    assert offline_page.blocked == []


def test_redoc_renders_every_operation_offline(live_server: LiveServer,
                                               offline_page: OfflinePage) -> None:
    rendered = rendered_count(offline_page, f"{live_server.url}/redoc",
                              "[data-section-id^='operation/']")
    assert rendered == len(operation_ids(live_server))
    # ReDoc's bundle always asks for its maker's logo, and hides it when that fails.
    assert set(offline_page.blocked) <= {REDOCLY_LOGO}
