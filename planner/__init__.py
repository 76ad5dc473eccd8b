"""hetplan's pure core: documents, cost model, simulator, search. No I/O."""

from planner.documents import Plan, Scenario, parse_plan, parse_scenario
from planner.errors import (
    Infeasible,
    InvalidPlan,
    InvalidScenario,
    MissingProfile,
    PlannerError,
    SolverTimeout,
    UnsupportedExport,
)
from planner.estimate import Evaluation, evaluate
from planner.search import PlanResult, PlanStatus, SearchOptions, plan

__version__ = "0.1.0"

__all__ = [
    "Evaluation",
    "Infeasible",
    "InvalidPlan",
    "InvalidScenario",
    "MissingProfile",
    "Plan",
    "PlanResult",
    "PlanStatus",
    "PlannerError",
    "Scenario",
    "SearchOptions",
    "SolverTimeout",
    "UnsupportedExport",
    "evaluate",
    "parse_plan",
    "parse_scenario",
    "plan",
]
