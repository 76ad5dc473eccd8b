"""A real headless Chromium against a real server on loopback, with the network cut.

The browser is the system's Chromium (Debian: `apt-get install chromium`; `.ci/run`
installs it where apt-get works), driven by Playwright from the dev extra; Playwright's
own browser download is never used. Where no Chromium is installed (or
HETPLAN_CHROMIUM names none), these tests skip and say so. Every request the page makes
to anything but the server is aborted and recorded; tests assert there were none.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.live_server import serving

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
LOOPBACK_HOSTS = {"127.0.0.1", "localhost"}


def chromium_executable() -> str | None:
    named = os.environ.get("HETPLAN_CHROMIUM")
    if named:
        return named if Path(named).exists() else None
    return next((path for name in CHROMIUM_NAMES if (path := shutil.which(name))), None)


@dataclass
class LiveServer:
    url: str


@pytest.fixture
def live_server(tmp_path: Path) -> Iterator[LiveServer]:
    """The hetplan app on a free loopback port, SQLite in tmp_path, no auth."""
    with serving(tmp_path / "browser.db") as url:
        yield LiveServer(url=url)


@dataclass
class OfflinePage:
    """A page whose requests beyond loopback fail; what it tried and logged is kept."""

    page: Any
    blocked: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)


@pytest.fixture
def offline_page() -> Iterator[OfflinePage]:
    executable = chromium_executable()
    if executable is None:
        pytest.skip("no Chromium installed (apt-get install chromium, or set HETPLAN_CHROMIUM "
                    "to a Chromium executable) for the headless-browser tests")
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="Playwright is not installed (pip install -e '.[dev]')")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable,
                                             args=["--no-sandbox", "--disable-gpu"])
        context = browser.new_context()
        offline = OfflinePage(page=context.new_page())

        def only_loopback(route: Any) -> None:
            url = urlsplit(route.request.url)
            if url.scheme in ("file", "data") or url.hostname in LOOPBACK_HOSTS:
                route.continue_()
            else:
                offline.blocked.append(route.request.url)
                route.abort("internetdisconnected")

        context.route("**/*", only_loopback)
        offline.page.on("console", lambda message: message.type == "error"
                        and offline.console_errors.append(message.text))
        offline.page.on("pageerror", lambda error: offline.console_errors.append(str(error)))
        try:
            yield offline
        finally:
            context.close()
            browser.close()
