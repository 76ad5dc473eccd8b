"""JSON Schemas of the scenario and plan documents, generated from the models that parse
them, so a field added to a model appears in its schema with no second place to edit.

docs/formats.md explains each field in words; its test checks that every property of
these schemas is explained there.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel

from planner.documents import Plan, Scenario

__all__ = ["DocumentKind", "document_schema"]

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


class DocumentKind(StrEnum):
    SCENARIO = "scenario"
    PLAN = "plan"


_MODELS: dict[DocumentKind, type[BaseModel]] = {
    DocumentKind.SCENARIO: Scenario,
    DocumentKind.PLAN: Plan,
}


def document_schema(kind: DocumentKind) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a `kind` document, as its model validates it."""
    schema = _MODELS[kind].model_json_schema(mode="validation")
    return {"$schema": JSON_SCHEMA_DIALECT, **schema,
            "description": f"A hetplan {kind.value} document; docs/formats.md of the hetplan "
                           "repository explains every field."}
