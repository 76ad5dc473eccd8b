"""The estimator reproduces every shared test vector to floating-point precision: every
field an expected file holds, the version 1.1 schedules and the section 7 prices included."""

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
    r"(?P<base>.*?)\.(?:homogeneous|unaware|"
    r"(?P<variant>zero1|gpipe|nonblocking|onenic|interleaved|local)"
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
    if isinstance(theirs, list) and isinstance(ours, list):
        return len(ours) == len(theirs) and all(map(_close, ours, theirs))
    if isinstance(theirs, dict) and isinstance(ours, dict):
        return ours.keys() == theirs.keys() and all(_close(ours[k], theirs[k]) for k in theirs)
    if isinstance(theirs, int | float) and not isinstance(theirs, bool) and \
            isinstance(ours, int | float) and not isinstance(ours, bool):
        return math.isclose(ours, theirs, rel_tol=1e-9, abs_tol=1e-12)
    return ours == theirs


# Where our evaluation words a value differently from the vectors.
NOT_COMPARED = {"warnings"}
"""Our own wording; `test_local_vectors_warn_that_training_differs` checks that it is there."""


def _as_theirs(key: str, ours: object, theirs: object) -> object:
    """Our `recompute_input_bytes` is always per chunk; the vectors give a one-range stage's
    as a number."""
    if key == "recompute_input_bytes" and isinstance(ours, list) and not isinstance(theirs, list):
        return ours[0] if len(ours) == 1 else ours
    return ours


def test_every_reference_vector_is_collected() -> None:
    assert len(CASES) == 81
    assert sum(".interleaved." in plan.name or ".local." in plan.name for _, plan, _ in CASES) == 18


@pytest.mark.parametrize(("scenario", "plan", "expected"), CASES, ids=lambda p: p.name)
def test_estimator_matches_reference_vector(scenario: Path, plan: Path, expected: Path) -> None:
    want = json.loads(expected.read_text())
    got = evaluate(parse_scenario(json.loads(scenario.read_text())),
                   parse_plan(json.loads(plan.read_text()))).to_dict()
    for key, value in want.items():
        if key not in NOT_COMPARED | {"pipelines"}:
            assert _close(got[key], value), (key, got[key], value)
    assert len(got["pipelines"]) == len(want["pipelines"])
    for ours, theirs in zip(got["pipelines"], want["pipelines"], strict=True):
        for key, value in theirs.items():
            if key != "stages":
                assert _close(ours[key], value), (key, ours[key], value)
        assert len(ours["stages"]) == len(theirs["stages"])
        for s, (our_stage, their_stage) in enumerate(zip(ours["stages"], theirs["stages"],
                                                         strict=True)):
            for key, value in their_stage.items():
                mine = _as_theirs(key, our_stage[key], value)
                assert _close(mine, value), (ours["index"], s, key, mine, value)


def test_local_vectors_warn_that_training_differs() -> None:
    for scenario, plan, _ in CASES:
        if ".local." in plan.name:
            got = evaluate(parse_scenario(json.loads(scenario.read_text())),
                           parse_plan(json.loads(plan.read_text())))
            assert any("not end-to-end backpropagation" in w for w in got.warnings), plan.name


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
