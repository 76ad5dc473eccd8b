"""JSON Schemas of the documents: served, printed by the CLI, and true to the parser."""

from __future__ import annotations

import json
from typing import Any

import jsonschema_rs
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from api.cli import app
from api.cli.schema_commands import SchemaName
from planner.json_schemas import DocumentKind, document_schema


def test_the_cli_offers_exactly_the_document_kinds() -> None:
    assert [s.value for s in SchemaName] == [k.value for k in DocumentKind]


@pytest.mark.parametrize("kind", list(DocumentKind))
def test_the_service_and_the_cli_give_the_generated_schema(client: TestClient,
                                                           kind: DocumentKind) -> None:
    served = client.get(f"/v1/schemas/{kind.value}")
    printed = CliRunner().invoke(app, ["schema", kind.value])
    assert served.status_code == 200
    assert printed.exit_code == 0, printed.output
    assert served.json() == json.loads(printed.stdout) == document_schema(kind)


def test_the_bundled_scenario_and_plan_satisfy_their_schemas(
        scenario: dict[str, Any], plan_document: dict[str, Any]) -> None:
    jsonschema_rs.validate(document_schema(DocumentKind.SCENARIO), scenario)
    jsonschema_rs.validate(document_schema(DocumentKind.PLAN), plan_document)


def test_the_scenario_schema_rejects_what_the_parser_rejects(scenario: dict[str, Any]) -> None:
    validator = jsonschema_rs.validator_for(document_schema(DocumentKind.SCENARIO))
    without_job = {k: v for k, v in scenario.items() if k != "job"}
    zero_gpus = json.loads(json.dumps(scenario))
    zero_gpus["cluster"]["nodes"][0]["gpus"] = 0
    assert not validator.is_valid(without_job)
    assert not validator.is_valid(zero_gpus)
