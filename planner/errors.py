"""The planner's errors, one hierarchy, mapped to HTTP once in `api`.

    PlannerError
    ├── InvalidScenario   the scenario document breaks a rule (every problem listed)
    ├── InvalidPlan       a plan document is malformed beyond evaluation
    ├── MissingProfile    a needed (gpu_type, kind, micro_batch, tp) point has no row
    ├── Infeasible        nothing fits: no stage of any shape holds the model
    ├── SolverTimeout     the solver found nothing before its time limit
    └── UnsupportedExport a launcher format cannot express what the plan uses
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "Problem",
    "PlannerError",
    "InvalidScenario",
    "InvalidPlan",
    "MissingProfile",
    "Infeasible",
    "SolverTimeout",
    "UnsupportedExport",
]


@dataclass(frozen=True, kw_only=True)
class Problem:
    """One thing wrong with a document: where, what was found, what to change."""

    path: str
    """Dotted field path, e.g. `cluster.nodes[2].gpus`."""
    message: str
    value: Any = None

    def __str__(self) -> str:
        shown = "" if self.value is None else f" (got {self.value!r})"
        return f"{self.path}: {self.message}{shown}"


class PlannerError(Exception):
    """Base of every error the planner core raises on bad input."""


class _WithProblems(PlannerError):
    def __init__(self, problems: list[Problem], what: str) -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{what} ({len(self.problems)} problem(s)):\n{lines}")


class InvalidScenario(_WithProblems):
    def __init__(self, problems: list[Problem]) -> None:
        super().__init__(problems, "invalid scenario document")


class InvalidPlan(_WithProblems):
    def __init__(self, problems: list[Problem]) -> None:
        super().__init__(problems, "invalid plan document")


class MissingProfile(PlannerError):
    pass


class Infeasible(PlannerError):
    pass


class SolverTimeout(PlannerError):
    pass


class UnsupportedExport(PlannerError):
    """A launcher format cannot express the plan; `reasons` lists what it uses that the format
    lacks (mixed TP degrees, asymmetric pipelines, ...)."""

    def __init__(self, fmt: str, reasons: list[str]) -> None:
        self.format = fmt
        self.reasons = list(reasons)
        lines = "\n".join(f"  - {r}" for r in self.reasons)
        super().__init__(f"the plan cannot be exported as {fmt}:\n{lines}")
