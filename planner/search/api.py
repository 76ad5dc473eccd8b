"""Public entry point of the search (being filled in: see issue 2)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from planner.documents import Plan, Scenario
from planner.estimate import Evaluation

__all__ = ["PlanStatus", "SearchOptions", "PlanResult", "plan"]

ProgressCallback = Callable[[float, str], None]
"""Called with (fraction done in [0, 1], what the search is doing)."""


class PlanStatus(StrEnum):
    OPTIMAL = "optimal"
    FEASIBLE = "feasible"
    HEURISTIC = "heuristic"


@dataclass(frozen=True, kw_only=True)
class SearchOptions:
    time_limit_s: float = 10.0
    """Wall-clock budget of the whole search; the best plan found by then is returned."""
    exact: bool = False
    """Enumerate the whole space of small scenarios and prove the optimum."""
    num_workers: int = 1
    """CP-SAT search workers."""


@dataclass(frozen=True, kw_only=True)
class PlanResult:
    plan: Plan
    """The plan document, with `estimate` and a `search` section saying how it was found."""
    evaluation: Evaluation
    status: PlanStatus
    wall_s: float
    unused_gpus: dict[str, str] = field(default_factory=dict)
    """GPU name -> why the plan leaves it idle."""


def plan(
    scenario: Scenario,
    options: SearchOptions | None = None,
    progress: ProgressCallback | None = None,
) -> PlanResult:
    raise NotImplementedError("the search lands with issue 2")
