"""The plan search: candidate pipelines, exact layer partition, CP-SAT allocation."""

from planner.search.api import PlanResult, PlanStatus, SearchOptions, plan

__all__ = ["PlanResult", "PlanStatus", "SearchOptions", "plan"]
