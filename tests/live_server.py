"""A hetplan app served by uvicorn on a free loopback port, in a thread: for tests that
need a real server (a browser, or the CLI's --server)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn

from api.app import create_app
from api.settings import Settings

START_TIMEOUT_S = 20


@contextmanager
def serving(database: Path) -> Iterator[str]:
    """The URL of a server with default settings (no auth) on SQLite at `database`, its
    searches at niceness 0 (as in tests/api/conftest.py: at 10 they starved behind the
    other test worker's processes)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    app = create_app(Settings(database_url=f"sqlite:///{database}", search_niceness=0))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"the test server did not start within {START_TIMEOUT_S} s")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
