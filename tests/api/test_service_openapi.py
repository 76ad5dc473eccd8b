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


def security_of(tmp_path: Path, **settings: object) -> dict[str, bool]:
    app = create_app(Settings(database_url=f"sqlite:///{tmp_path / 'unused.db'}",
                              **settings))  # type: ignore[arg-type]
    paths = app.openapi()["paths"]
    return {op["operationId"]: "security" in op
            for operations in paths.values() for op in operations.values()}


def test_without_tokens_no_operation_declares_security(tmp_path: Path) -> None:
    assert not any(security_of(tmp_path).values())


def test_with_tokens_writes_declare_security_and_open_reads_do_not(tmp_path: Path) -> None:
    declared = security_of(tmp_path, tokens={"t": ["admin"]})
    assert declared["create_plan"] and declared["upload_profiles"] and declared["cancel_job"]
    assert not declared["get_plan"] and not declared["list_profile_sets"]
    assert not declared["readyz"]


def test_with_tokens_required_for_reads_reads_declare_security(tmp_path: Path) -> None:
    declared = security_of(tmp_path, tokens={"t": ["admin"]}, read_requires_token=True)
    assert declared["get_plan"] and declared["create_plan"]
    assert not declared["healthz"]
