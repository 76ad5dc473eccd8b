"""bench/local_search.py judges the search: its moves must build plans the estimator can
judge, and its walk must find what a spoiled plan lost."""

from __future__ import annotations

import copy
import importlib
import json
import random
import sys
from pathlib import Path

import pytest

from planner import evaluate, parse_plan, parse_scenario

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
local_search = importlib.import_module("local_search")  # bench/ scripts import as scripts

SCENARIO = ROOT / "tests" / "data" / "scenarios" / "a80x16-v32x16-gpt1.3b.json"
REFERENCE = ROOT / "bench" / "reference" / "per-type" / "a80x16-v32x16-gpt1.3b.plan.json"


def _spoiled() -> dict:
    """The per-type reference with its first pipeline's first boundary moved three layers and
    half its micro-batches given to the last pipeline."""
    doc = json.loads(REFERENCE.read_text())
    doc.pop("estimate", None)
    pipelines = doc["pipelines"]
    first = next(p for p in pipelines if len(p["stages"]) >= 2)
    cut = first["stages"][0]["layers"][1] - 3
    first["stages"][0]["layers"][1] = first["stages"][1]["layers"][0] = cut
    moved = pipelines[0]["num_micro_batches"] // 2
    pipelines[0]["num_micro_batches"] -= moved
    same = next(p for p in reversed(pipelines)
                if p["micro_batch_size"] == pipelines[0]["micro_batch_size"])
    same["num_micro_batches"] += moved
    return doc


def test_walk_recovers_what_a_spoiled_plan_lost() -> None:
    scenario = parse_scenario(json.loads(SCENARIO.read_text()))
    start = parse_plan(_spoiled())
    start_eval = evaluate(scenario, start)
    reference_eval = evaluate(scenario, parse_plan(json.loads(REFERENCE.read_text())))
    assert start_eval.valid and reference_eval.valid
    assert start_eval.iteration_s > reference_eval.iteration_s * 1.01  # really spoiled

    walked, walked_s, wins, evaluations = local_search.walk(
        scenario, start, seconds=120, rng=random.Random(0), max_evaluations=400)

    judged = evaluate(scenario, walked)
    assert judged.valid and judged.iteration_s == pytest.approx(walked_s)
    assert walked_s < start_eval.iteration_s * 0.99
    assert sum(wins.values()) >= 1 and evaluations <= 401


def test_every_move_builds_a_document_or_declines() -> None:
    scenario = parse_scenario(json.loads(SCENARIO.read_text()))
    space = local_search.Space(scenario)
    doc = _spoiled()
    rng = random.Random(1)
    judged = 0
    for name, move in local_search.MOVES.items():
        for _ in range(30):
            moved = move(space, rng, copy.deepcopy(doc))
            if moved is None:
                continue
            gpus = [g for p in moved["pipelines"] for s in p["stages"] for g in s["gpus"]]
            assert len(gpus) == len(set(gpus)), name  # no GPU placed twice
            assert sum(p["micro_batch_size"] * p["num_micro_batches"]
                       for p in moved["pipelines"]) == scenario.job.global_batch_size, name
            evaluate(scenario, parse_plan(moved))
            judged += 1
    assert judged > 100
