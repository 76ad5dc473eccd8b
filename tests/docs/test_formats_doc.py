"""docs/formats.md is the reference of the document formats: every field the models
accept must be explained there, in the table of its object, and every schedule named."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from planner.documents import Schedule
from planner.json_schemas import DocumentKind, document_schema

FORMATS = Path(__file__).parents[2] / "docs" / "formats.md"
HEADING = re.compile(r"^### `(\w+)`", re.MULTILINE)
FIELD_ROW = re.compile(r"^\| `(\w+)` \|", re.MULTILINE)


def documented_fields() -> dict[str, set[str]]:
    """Object title -> the fields its table lists (a section runs to the next heading)."""
    text = FORMATS.read_text()
    starts = [(m.group(1), m.end()) for m in HEADING.finditer(text)]
    sections = {}
    for (title, start), (_, end) in zip(starts, [*starts[1:], ("", len(text))], strict=True):
        body = text[start:end].split("\n## ")[0]
        sections[title] = set(FIELD_ROW.findall(body))
    return sections


def schema_objects(kind: DocumentKind) -> dict[str, set[str]]:
    """Object title -> its property names, for the document and every object it holds."""
    schema = document_schema(kind)
    objects: dict[str, dict[str, Any]] = {schema["title"]: schema, **schema.get("$defs", {})}
    return {title: set(obj["properties"]) for title, obj in objects.items()
            if obj.get("properties")}


@pytest.mark.parametrize("kind", list(DocumentKind))
def test_every_model_field_has_a_row_in_its_objects_table(kind: DocumentKind) -> None:
    documented = documented_fields()
    missing = {title: sorted(fields - documented.get(title, set()))
               for title, fields in schema_objects(kind).items()}
    missing = {title: fields for title, fields in missing.items() if fields}
    assert not missing, (f"docs/formats.md lacks rows for these fields (add them to the table "
                         f"under '### `Title`'): {missing}")


def test_the_field_check_sees_a_removed_row() -> None:
    documented = documented_fields()
    assert "nics" in documented["Node"]
    assert "nics" not in documented["Link"]


def test_every_schedule_is_named() -> None:
    text = FORMATS.read_text()
    unnamed = [s.value for s in Schedule if f'`"{s.value}"`' not in text]
    assert not unnamed, f"docs/formats.md does not name these schedules: {unnamed}"
