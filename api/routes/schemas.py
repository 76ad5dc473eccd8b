"""JSON Schemas of the scenario and plan documents: public, like the OpenAPI document."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from planner.json_schemas import DocumentKind, document_schema

router = APIRouter(prefix="/v1/schemas", tags=["formats"])


@router.get("/scenario", operation_id="get_scenario_schema",
            summary="JSON Schema of a scenario document (hetplan-scenario/1)")
def scenario_schema() -> dict[str, Any]:
    """Generated from the model that parses scenarios; docs/formats.md explains the fields."""
    return document_schema(DocumentKind.SCENARIO)


@router.get("/plan", operation_id="get_plan_schema",
            summary="JSON Schema of a plan document (hetplan-plan/1)")
def plan_schema() -> dict[str, Any]:
    """Generated from the model that parses plans; docs/formats.md explains the fields."""
    return document_schema(DocumentKind.PLAN)
