"""The allocation's runners-up: allocations with the best one's largest template banned."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner import parse_scenario
from planner.search import allocate as allocate_module
from planner.search.allocate import Allocation, allocate, pareto, prune
from planner.search.tables import ScenarioTables, compile_tables
from planner.search.templates import PipelineTemplate, generate_templates

SCENARIOS = Path(__file__).resolve().parent.parent / "data" / "scenarios"


def four_types() -> tuple[ScenarioTables, list[PipelineTemplate]]:
    scenario = parse_scenario(json.loads(
        (SCENARIOS / "l40sx16-a40x8-v32x16-t4x8-gpt2.7b.json").read_text()))
    tables = compile_tables(scenario)
    templates = pareto(prune(generate_templates(tables, scenario.job.schedule)),
                       [c.key for c in tables.classes], num_pipelines=8)
    return tables, templates


def fits(tables: ScenarioTables, templates: list[PipelineTemplate], counts: dict[int, int]) -> bool:
    used: dict[tuple[tuple[str, str | None], int], int] = {}
    for k, n in counts.items():
        for row, gpus in templates[k].usage(tables.resource_levels).items():
            used[row] = used.get(row, 0) + n * gpus
    return all(gpus <= tables.resource_rows[row] for row, gpus in used.items())


def largest(templates: list[PipelineTemplate], counts: dict[int, int]) -> int:
    return max(counts, key=lambda k: (counts[k] * templates[k].num_gpus, -k))


def test_runners_up_leave_the_best_allocation_as_it_was_and_ban_its_largest_template() -> None:
    tables, templates = four_types()
    alone = allocate(tables, templates, max_pipelines=None, time_limit_s=10)
    more = allocate(tables, templates, max_pipelines=None, time_limit_s=10, runners_up=2)
    assert isinstance(alone, Allocation) and isinstance(more, Allocation)
    assert more.counts == alone.counts and more.proven == alone.proven
    assert more.visited[:len(alone.visited)] == alone.visited
    extra = more.visited[len(alone.visited):]
    assert extra, "no runner-up found"
    banned = largest(templates, alone.counts)
    assert all(banned not in counts for counts in extra)
    assert any(counts != alone.counts for counts in extra)
    for counts in more.visited:
        assert counts and fits(tables, templates, counts)


def test_a_capped_allocation_keeps_its_cap_in_its_runners_up() -> None:
    tables, templates = four_types()
    capped = allocate(tables, templates, max_pipelines=3, time_limit_s=10, runners_up=2)
    assert capped is not None
    assert all(0 < sum(counts.values()) <= 3 for counts in capped.visited)


def knapsacks_counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    solve = allocate_module._knapsack

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return solve(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(allocate_module, "_knapsack", counted)
    return calls


def test_a_seed_at_the_optimum_ends_there_with_a_knapsack_step_fewer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    tables, templates = four_types()
    calls = knapsacks_counted(monkeypatch)
    alone = allocate(tables, templates, max_pipelines=None, time_limit_s=10)
    unseeded_steps = len(calls)
    calls.clear()
    seeded = allocate(tables, templates, max_pipelines=None, time_limit_s=10,
                      seed=dict(alone.counts) if alone else None)
    assert alone is not None and seeded is not None and alone.proven and seeded.proven
    assert seeded.pipeline_s == pytest.approx(alone.pipeline_s, rel=1e-12)
    assert alone.counts in seeded.visited[1:2]  # started from it, after the greedy one
    assert len(calls) == unseeded_steps - 1 == 1


def test_a_seed_that_breaks_the_cap_is_not_taken() -> None:
    tables, templates = four_types()
    free = allocate(tables, templates, max_pipelines=None, time_limit_s=10)
    assert free is not None and sum(free.counts.values()) > 3
    capped = allocate(tables, templates, max_pipelines=3, time_limit_s=10)
    seeded = allocate(tables, templates, max_pipelines=3, time_limit_s=10,
                      seed=dict(free.counts))
    assert capped is not None and seeded is not None
    assert seeded == capped
