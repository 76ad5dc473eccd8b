"""The OpenAPI document is pinned: a change to the API shows up as a diff of
`openapi.snapshot.json`. After a deliberate change, regenerate it with
`HETPLAN_UPDATE_SNAPSHOT=1 pytest tests/api/test_service_openapi.py` and review the diff."""

from __future__ import annotations

import json
import os
from pathlib import Path

from api.app import create_app
from api.settings import Settings

SNAPSHOT = Path(__file__).parent / "openapi.snapshot.json"


def current_document(tmp_path: Path) -> str:
    app = create_app(Settings(database_url=f"sqlite:///{tmp_path / 'unused.db'}"))
    return json.dumps(app.openapi(), indent=1, sort_keys=True) + "\n"


def test_openapi_document_matches_the_snapshot(tmp_path: Path) -> None:
    document = current_document(tmp_path)
    if os.environ.get("HETPLAN_UPDATE_SNAPSHOT") == "1":
        SNAPSHOT.write_text(document)
    assert document == SNAPSHOT.read_text(), (
        "the API changed; if on purpose, regenerate the snapshot (see this module's docstring)")


def test_every_operation_is_versioned_and_documents_errors(tmp_path: Path) -> None:
    paths = json.loads(current_document(tmp_path))["paths"]
    unversioned = {p for p in paths if not p.startswith("/v1/")}
    assert unversioned == {"/healthz", "/readyz", "/metrics"}
    for path, operations in paths.items():
        if path.startswith("/v1/"):
            for method, operation in operations.items():
                takes_input = "parameters" in operation or "requestBody" in operation
                assert "422" in operation["responses"] or not takes_input, f"{method} {path}"
