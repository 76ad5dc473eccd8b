"""Request and answer bodies of the frontier (`POST /v1/plans/pareto`) and what-if fleets
(`POST /v1/whatif`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from api.schemas import ScenarioSource
from planner.fleet import DEFAULT_MAX_FLEETS, FleetVariant

__all__ = ["ParetoOptions", "ParetoRequest", "FrontierPoint", "FrontierPublic",
           "WhatIfOptions", "WhatIfRequest", "WhatIfRowPublic", "WhatIfPublic"]

MAX_VARIANTS = 64


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)

    time_limit_s: float = Field(
        default=1.0, gt=0, le=86_400,
        description="Search budget per planned fleet; when all of them together exceed the "
        "server's max_time_limit_s the answer is a job (202).")


class ParetoOptions(_Options):
    max_fleets: int = Field(default=DEFAULT_MAX_FLEETS, ge=1, le=256, description=(
        "Most sub-fleets planned: every subset of the GPU types with all their nodes first, "
        "then the same at a half and a quarter of each type's nodes, then mixed shares."))


class ParetoRequest(ScenarioSource):
    options: ParetoOptions = ParetoOptions()

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"cluster": "lab", "model": "gpt-tiny", "job": {"global_batch_size": 512},
         "options": {"time_limit_s": 1, "max_fleets": 8}}]})


class FrontierPoint(BaseModel):
    samples_per_s: float
    usd_per_hour: float
    usd_per_million_tokens: float | None = None
    fleet: str = Field(description="The GPU types and nodes the point was planned on.")
    plan_id: str = Field(description="The stored plan: GET /v1/plans/{plan_id}.")
    plan: dict[str, Any]


class FrontierPublic(BaseModel):
    frontier: list[FrontierPoint] = Field(description=(
        "Plans none of which is at least as fast and as cheap as another (and better in "
        "one), cheapest first."))
    fleets_planned: int
    wall_s: float


class WhatIfOptions(_Options):
    pass


class WhatIfRequest(ScenarioSource):
    variants: list[FleetVariant] = Field(min_length=1, max_length=MAX_VARIANTS)
    options: WhatIfOptions = WhatIfOptions()

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"cluster": "lab", "model": "gpt-tiny", "job": {"global_batch_size": 512},
         "variants": [{"add": [{"gpu_type": "A100-80G", "nodes": 2}]},
                      {"remove_types": ["V100-32G"]}],
         "options": {"time_limit_s": 1}}]})


class WhatIfRowPublic(BaseModel):
    name: str
    num_gpus: int
    samples_per_s: float | None = None
    usd_per_hour: float | None = None
    usd_per_million_tokens: float | None = None
    samples_per_s_change: float | None = Field(
        default=None, description="Relative to the base fleet: 0.25 is 25 % more.")
    usd_per_hour_change: float | None = None
    usd_per_million_tokens_change: float | None = None
    errors: list[str] = Field(default_factory=list)
    plan_id: str | None = None


class WhatIfPublic(BaseModel):
    rows: list[WhatIfRowPublic] = Field(description="The base fleet first, then each variant.")
