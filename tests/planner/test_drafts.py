"""Drafts left out before their sync is estimated are those `best_realized` would not place."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner import parse_scenario
from planner.search import baselines
from planner.search.drafts import best_realized, contending_replicas, identical_draft
from planner.search.tables import compile_tables
from planner.search.templates import TemplateContext

SCENARIOS = Path(__file__).resolve().parent.parent / "data" / "scenarios"


@pytest.mark.parametrize("name", ["a80x16-v32x16-gpt1.3b", "h200x8-h100x16-a80x16-llama13b",
                                  "v16x32-a10x16-llama7b-memtight"])
def test_contending_replicas_place_what_every_replica_count_would(name: str) -> None:
    doc = json.loads((SCENARIOS / f"{name}.json").read_text())
    doc["job"]["global_batch_size"] *= 4  # more counts divide the batch
    tables = compile_tables(parse_scenario(doc))
    offers = list(baselines._homogeneous(TemplateContext(tables, tables.scenario.job.schedule)))
    every = [identical_draft(tables, template, n, origin)
             for template, counts, origin in offers for n in counts]
    drafted = [d for d in every if d is not None]
    for keep in (1, 3, 6):
        contending = contending_replicas(tables, offers, keep)
        assert len(contending) < len(drafted) if keep == 1 else len(contending) <= len(drafted)
        placed = best_realized(tables, contending, keep)
        expected = best_realized(tables, every, keep)
        assert [(c.quick_s, c.origin) for c in placed] == [(c.quick_s, c.origin) for c in expected]
