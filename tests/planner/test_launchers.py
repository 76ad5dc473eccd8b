"""Identical replicas of one template: the family every search offers, and what a named
launcher is restricted to."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from planner import parse_scenario
from planner.search import launchers
from planner.search.allocate import pareto, prune
from planner.search.drafts import Draft
from planner.search.tables import ScenarioTables, compile_tables
from planner.search.templates import PipelineTemplate, generate_templates

SCENARIOS = Path(__file__).resolve().parent.parent / "data" / "scenarios"


def _tables_and_templates(name: str, nodes_times: int) -> tuple[ScenarioTables,
                                                                 list[PipelineTemplate]]:
    doc = json.loads((SCENARIOS / f"{name}.json").read_text())
    doc["cluster"]["nodes"] = [dict(node, name=f"{node['name']}-{k}")
                               for k in range(nodes_times) for node in doc["cluster"]["nodes"]]
    tables = compile_tables(parse_scenario(doc))
    templates = generate_templates(tables, tables.scenario.job.schedule)
    return tables, pareto(prune(templates), [c.key for c in tables.classes], num_pipelines=8)


def _every_count_ranked(tables: ScenarioTables, templates: list[PipelineTemplate], keep: int,
                        even: bool) -> list[tuple[int, int]]:
    """(count, template id) of the `keep` least rough times, every count of every template
    ranked: what the ranking's early stop must reproduce."""
    batch = tables.scenario.job.global_batch_size
    gpus = {c.key: c.num_gpus for c in tables.classes}

    def options(template: PipelineTemplate) -> list[tuple[float, int, int]]:
        if batch % template.micro_batch:
            return []
        samples = batch // template.micro_batch  # micro-batches, all pipelines together
        fit = min(min(gpus[key] // n for key, n in template.gpus().items()), samples)
        shares = {n: math.ceil(samples / n) for n in range(1, fit + 1)
                  if not even or samples % n == 0}
        return [(template.time_s(m) + template.sync_s(n), n, id(template))
                for n, m in sorted(shares.items(), reverse=True)
                if template.max_micro_batches is None or m <= template.max_micro_batches]

    every = [option for template in templates for option in options(template)]
    return [(n, key) for _, n, key in sorted(every, key=lambda option: option[0])[:keep]]


def _drafted(monkeypatch: pytest.MonkeyPatch, tables: ScenarioTables,
             templates: list[PipelineTemplate], keep: int, even: bool) -> list[tuple[int, int]]:
    offered: list[tuple[int, int]] = []

    def replicas(tables: ScenarioTables, template: PipelineTemplate, count: int,
                 origin: str) -> Draft | None:
        offered.append((count, id(template)))
        return None

    monkeypatch.setattr(launchers, "replicas_draft", replicas)
    list(launchers._grid_drafts(tables, templates, keep, even))
    return offered


@pytest.mark.parametrize(("name", "times"), [("h200x8-h100x16-a80x16-llama13b", 1),
                                             ("l40sx16-a40x8-v32x16-t4x8-gpt2.7b", 4)])
@pytest.mark.parametrize("even", [True, False])
def test_the_ranking_stops_early_yet_keeps_what_ranking_every_count_keeps(
        monkeypatch: pytest.MonkeyPatch, name: str, times: int, even: bool) -> None:
    tables, templates = _tables_and_templates(name, times)
    for keep in (1, 6, 64):
        expected = _every_count_ranked(tables, templates, keep, even)
        assert len(expected) == keep
        assert _drafted(monkeypatch, tables, templates, keep, even) == expected


def test_replicas_that_do_not_divide_the_batch_share_it_within_one_micro_batch() -> None:
    """Replica counts that do not divide the batch: a launcher restricted to one grid (one
    share for all) never gets them, every other search does, each share within one
    micro-batch of the others."""
    tables, templates = _tables_and_templates("a80x16-v32x16-gpt1.3b", 1)
    batch = tables.scenario.job.global_batch_size
    every = launchers.launcher_candidates(tables, templates, keep=10_000, slack=float("inf"),
                                          even=False)
    even = launchers.launcher_candidates(tables, templates, keep=10_000, slack=float("inf"))
    uneven = [c for c in every if "differing" in c.origin]
    assert uneven and not [c for c in even if "differing" in c.origin]
    for candidate in uneven:
        pipelines = candidate.plan.pipelines
        samples = [p.micro_batch_size * p.num_micro_batches for p in pipelines]
        assert sum(samples) == batch
        assert max(p.num_micro_batches for p in pipelines) - min(
            p.num_micro_batches for p in pipelines) <= 1
        assert len({p.micro_batch_size for p in pipelines}) == 1
    for candidate in even:
        assert len({p.num_micro_batches for p in candidate.plan.pipelines}) == 1
