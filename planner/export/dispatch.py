"""One entry point for every launcher format, shared by Python, the CLI and the HTTP API:

    export_plan(plan, fmt, **options)   the export; each option must be one fmt takes
    scenario_options(scenario)          what a scenario says (layer kinds, schedule, ZeRO)
    export_with_scenario(plan, fmt, scenario, options)
                                        the scenario's options where fmt takes them, the
                                        caller's options over them (the CLI's --scenario,
                                        the API's stored scenario)
    expressible(plan, fmt)              None when fmt can run the plan, else the reasons
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from planner.documents import Plan, Scenario
from planner.errors import UnsupportedExport
from planner.export.cluster import export_kubernetes, export_slurm
from planner.export.formats import export_deepspeed, export_megatron, export_torchrun
from planner.export.pipelining import export_pipelining
from planner.export.torchtitan import export_torchtitan

__all__ = ["FORMATS", "export_plan", "export_with_scenario", "expressible", "format_options",
           "parse_gpu_names", "scenario_options"]

FORMATS: dict[str, Callable[..., dict[str, Any]]] = {
    "torchrun": export_torchrun,
    "pipelining": export_pipelining,
    "megatron": export_megatron,
    "deepspeed": export_deepspeed,
    "torchtitan": export_torchtitan,
    "kubernetes": export_kubernetes,
    "slurm": export_slurm,
}


def format_options(fmt: str) -> frozenset[str]:
    """The option names format `fmt` takes; `ValueError` for an unknown format."""
    try:
        exporter = FORMATS[fmt]
    except KeyError:
        raise ValueError(f"unknown export format {fmt!r}; use one of {sorted(FORMATS)}") from None
    return frozenset(exporter.__kwdefaults__ or {})


def _exporter(fmt: str, options: Mapping[str, Any]) -> Callable[..., dict[str, Any]]:
    known = format_options(fmt)
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for format {fmt!r}; "
                         f"it takes {sorted(known)}")
    return FORMATS[fmt]


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


def scenario_options(scenario: Scenario) -> dict[str, Any]:
    """What a scenario tells an export: its layer kinds, its job's schedule (the schedule of
    a plan that names none) and its job's ZeRO stage."""
    return {"layer_kinds": list(scenario.model.layers),
            "job_schedule": scenario.job.schedule.value,
            "zero_stage": scenario.job.zero_stage}


def export_with_scenario(plan: Plan, fmt: str, scenario: Scenario | None,
                         options: Mapping[str, Any]) -> dict[str, Any]:
    """`export_plan` with the scenario's options where `fmt` takes them and the caller's
    `options` (each one `fmt` must take) over them."""
    known = format_options(fmt)
    from_scenario = {} if scenario is None else scenario_options(scenario)
    merged = {k: v for k, v in from_scenario.items() if k in known} | dict(options)
    return export_plan(plan, fmt, **merged)


def parse_gpu_names(items: Sequence[str]) -> dict[str, str]:
    """`["A100-80G=NVIDIA-A100-SXM4-80GB", ...]` as a mapping (the CLI's and the API's form of
    the cluster exports' gpu_names)."""
    names: dict[str, str] = {}
    for item in items:
        gpu_type, sep, name = item.partition("=")
        if not (sep and gpu_type and name):
            raise ValueError(f"gpu name {item!r}: write TYPE=NAME, e.g. "
                             "A100-80G=NVIDIA-A100-SXM4-80GB")
        names[gpu_type] = name
    return names
