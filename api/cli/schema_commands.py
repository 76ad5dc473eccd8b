"""`hetplan schema scenario|plan`: the JSON Schema of a document, as the service serves it."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated

import typer

__all__ = ["register"]


class SchemaName(StrEnum):  # the values of planner.json_schemas.DocumentKind, not imported at start
    SCENARIO = "scenario"
    PLAN = "plan"


def schema_command(
    document: Annotated[SchemaName, typer.Argument(help="Which document.")],
) -> None:
    """Print the JSON Schema of a scenario or plan.

    docs/formats.md explains every field; the service serves the same schemas at
    /v1/schemas/scenario and /v1/schemas/plan."""
    from planner.json_schemas import DocumentKind, document_schema

    typer.echo(json.dumps(document_schema(DocumentKind(document.value)), indent=1))


def register(app: typer.Typer) -> None:
    app.command("schema")(schema_command)
