"""One entry point for every launcher format: `export_plan(plan, fmt, **options)`, and
`expressible(plan, fmt)` for callers (the search) that only need to know whether a
format can run a plan."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from planner.documents import Plan
from planner.errors import UnsupportedExport
from planner.export.formats import (
    export_deepspeed,
    export_megatron,
    export_pipelining,
    export_torchrun,
)
from planner.export.torchtitan import export_torchtitan

__all__ = ["FORMATS", "export_plan", "expressible"]

FORMATS: dict[str, Callable[..., dict[str, Any]]] = {
    "torchrun": export_torchrun,
    "pipelining": export_pipelining,
    "megatron": export_megatron,
    "deepspeed": export_deepspeed,
    "torchtitan": export_torchtitan,
}


def _exporter(fmt: str, options: dict[str, Any]) -> Callable[..., dict[str, Any]]:
    try:
        exporter = FORMATS[fmt]
    except KeyError:
        raise ValueError(f"unknown export format {fmt!r}; use one of {sorted(FORMATS)}") from None
    known = set(exporter.__kwdefaults__ or {})
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for format {fmt!r}; "
                         f"it takes {sorted(known)}")
    return exporter


def export_plan(plan: Plan, fmt: str, **options: Any) -> dict[str, Any]:
    """`plan` written for launcher format `fmt` as a JSON-ready dict.

    Raises `UnsupportedExport` listing what the plan uses that `fmt` cannot express,
    and `ValueError` for an unknown format or option."""
    return _exporter(fmt, options)(plan, **options)


def expressible(plan: Plan, fmt: str, **options: Any) -> str | None:
    """None when launcher format `fmt` can run `plan`, else every reason it cannot, one per
    line. Pure and cheap (no search), so a search may call it on each candidate."""
    try:
        export_plan(plan, fmt, **options)
    except UnsupportedExport as error:
        return "\n".join(error.reasons)
    return None
