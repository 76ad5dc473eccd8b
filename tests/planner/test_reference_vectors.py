"""The estimator reproduces every shared test vector to floating-point precision."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from planner import evaluate, parse_plan, parse_scenario

DATA = Path(__file__).parent.parent / "data"
REFERENCE = DATA / "reference"
NAME = re.compile(
    r"(?P<base>.*?)\.(?:homogeneous|unaware|(?P<variant>zero1|gpipe|nonblocking|onenic)"
    r"\.random\d+)\.plan\.json")


def _cases() -> list[tuple[Path, Path, Path]]:
    cases = []
    for plan_path in sorted(REFERENCE.glob("*.plan.json")):
        match = NAME.fullmatch(plan_path.name)
        assert match, plan_path.name
        if match["variant"]:
            scenario = REFERENCE / f"{match['base']}.{match['variant']}.json"
        else:
            scenario = DATA / "scenarios" / f"{match['base']}.json"
        expected = plan_path.with_name(plan_path.name.replace(".plan.json", ".expected.json"))
        cases.append((scenario, plan_path, expected))
    return cases


CASES = _cases()


def _close(ours: object, theirs: object) -> bool:
    if isinstance(theirs, float) and isinstance(ours, int | float):
        return math.isclose(ours, theirs, rel_tol=1e-9, abs_tol=1e-12)
    return ours == theirs


def test_every_reference_vector_is_collected() -> None:
    assert len(CASES) == 63


@pytest.mark.parametrize(("scenario", "plan", "expected"), CASES, ids=lambda p: p.name)
def test_estimator_matches_reference_vector(scenario: Path, plan: Path, expected: Path) -> None:
    want = json.loads(expected.read_text())
    got = evaluate(parse_scenario(json.loads(scenario.read_text())),
                   parse_plan(json.loads(plan.read_text()))).to_dict()
    top = ["valid", "errors", "iteration_s", "samples_per_s", "tokens_per_s", "sync_s",
           "blocking_transfers", "shared_nics", "compute_bound_iteration_s", "efficiency"]
    for key in top:
        assert _close(got[key], want[key]), (key, got[key], want[key])
    assert len(got["pipelines"]) == len(want["pipelines"])
    for ours, theirs in zip(got["pipelines"], want["pipelines"], strict=True):
        for key, value in theirs.items():
            if key != "stages":
                assert _close(ours[key], value), (key, ours[key], value)
        for our_stage, their_stage in zip(ours["stages"], theirs["stages"], strict=True):
            for key, value in their_stage.items():
                assert _close(our_stage[key], value), (key, our_stage[key], value)


def test_reference_summaries_match_our_baseline_reconstruction() -> None:
    """The compute bound of every summary equals ours."""
    from planner.bounds import compute_bound_s

    for summary_path in sorted(REFERENCE.glob("*.summary.json")):
        summary = json.loads(summary_path.read_text())
        scenario = parse_scenario(json.loads(
            (DATA / "scenarios" / f"{summary['scenario']}.json").read_text()))
        bound = compute_bound_s(scenario)
        assert bound is not None
        rate = scenario.job.global_batch_size / bound
        assert math.isclose(rate, summary["compute_bound_samples_per_s"], rel_tol=1e-9)
