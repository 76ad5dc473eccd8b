"""The iteration floor: never above what the estimator finds, worked by hand on tiny plans,
and None where the estimator would report a missing GPU or profile row."""

from __future__ import annotations

import json
from typing import Any

import pytest

from planner import evaluate, parse_plan, parse_scenario
from planner.bounds import iteration_floor_s
from tests.planner.scenarios import tiny
from tests.planner.test_reference_vectors import CASES


def two_stages(*, recompute: bool = False, m: int = 2, gpu: str = "n0:1") -> dict[str, Any]:
    """Layer a (1 + 2 ms) on n0:0, layer b (2 + 4 ms) on `gpu`; a sends nothing."""
    stage_b: dict[str, Any] = {"gpu_type": "G", "tp": 1, "gpus": [gpu], "layers": [1, 2]}
    if recompute:
        stage_b["recompute"] = True
    return {"format": "hetplan-plan/1", "pipelines": [{
        "micro_batch_size": 1, "num_micro_batches": m, "stages": [
            {"gpu_type": "G", "tp": 1, "gpus": ["n0:0"], "layers": [0, 1]}, stage_b]}]}


def test_the_floor_is_the_busiest_stages_work_and_the_fill_around_it() -> None:
    scenario = parse_scenario(tiny(global_batch_size=2))
    plan_doc = parse_plan(two_stages())
    # Stage 1 runs 2 x (2 + 4) ms, after stage 0's first forward (1 ms) and before stage
    # 0's last backward (2 ms): 15 ms, which is what the simulation finds.
    assert iteration_floor_s(scenario, plan_doc) == pytest.approx(0.015, rel=1e-12)
    assert evaluate(scenario, plan_doc).iteration_s == pytest.approx(0.015, rel=1e-12)


def test_recomputation_adds_the_forward_again_to_the_floor() -> None:
    scenario = parse_scenario(tiny(global_batch_size=2))
    assert iteration_floor_s(scenario, parse_plan(two_stages(recompute=True))) == pytest.approx(
        (1 + 2 * (2 + 2 + 4) + 2) * 1e-3, rel=1e-12)


def test_one_stage_takes_exactly_its_bound() -> None:
    scenario = parse_scenario(tiny(global_batch_size=3))
    plan_doc = parse_plan({"format": "hetplan-plan/1", "pipelines": [{
        "micro_batch_size": 1, "num_micro_batches": 3, "stages": [
            {"gpu_type": "G", "tp": 1, "gpus": ["n0:0"], "layers": [0, 2]}]}]})
    iteration = evaluate(scenario, plan_doc).iteration_s
    assert iteration == pytest.approx(3 * 9e-3, rel=1e-12)
    assert iteration_floor_s(scenario, plan_doc) == pytest.approx(iteration, rel=1e-12)


def test_an_unknown_gpu_or_a_missing_row_gives_no_bound() -> None:
    scenario = parse_scenario(tiny(global_batch_size=2))
    assert iteration_floor_s(scenario, parse_plan(two_stages(gpu="n9:0"))) is None
    unprofiled = two_stages(m=1)
    unprofiled["pipelines"][0]["micro_batch_size"] = 2  # rows exist at micro-batch 1 only
    assert iteration_floor_s(scenario, parse_plan(unprofiled)) is None


@pytest.mark.parametrize("case", CASES, ids=[plan.name for _, plan, _ in CASES])
def test_no_reference_plan_runs_faster_than_its_floor(case: Any) -> None:
    scenario_path, plan_path, _ = case
    scenario = parse_scenario(json.loads(scenario_path.read_text()))
    plan_doc = parse_plan(json.loads(plan_path.read_text()))
    bound = iteration_floor_s(scenario, plan_doc)
    iteration = evaluate(scenario, plan_doc).iteration_s
    assert bound is not None and iteration is not None
    assert bound <= iteration * (1 + 1e-12)  # summed in another order: rounding apart
