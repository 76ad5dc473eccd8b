"""Section 7: Pareto dominance, and the estimate section a plan document carries."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner import evaluate, parse_plan, parse_scenario
from planner.estimate import Evaluation, dominates, estimate_section, with_estimate
from tests.planner.scenarios import pipeline, plan, stage, uniform


@dataclass(frozen=True)
class Point:
    samples_per_s: float | None
    usd_per_hour: float | None


@pytest.mark.parametrize(("a", "b", "expected"), [
    (Point(10, 5), Point(10, 5), False),     # equal: neither is better
    (Point(11, 5), Point(10, 5), True),      # faster, same price
    (Point(10, 4), Point(10, 5), True),      # cheaper, same speed
    (Point(11, 4), Point(10, 5), True),      # both
    (Point(11, 6), Point(10, 5), False),     # faster but dearer: a trade-off
    (Point(10, None), Point(1, 5), False),   # no price: out of the comparison
    (Point(10, 1), Point(1, None), False),
])
def test_dominance_needs_no_worse_on_both_and_better_on_one(a: Point, b: Point,
                                                            expected: bool) -> None:
    assert dominates(a, b) is expected


rates = st.floats(0.1, 1e4)


@given(a=st.builds(Point, rates, rates), b=st.builds(Point, rates, rates))
def test_dominance_is_never_mutual(a: Point, b: Point) -> None:
    assert not (dominates(a, b) and dominates(b, a))


def test_estimate_section_leaves_out_an_unknown_price() -> None:
    section = estimate_section(Evaluation(valid=True, errors=[], iteration_s=2.0,
                                          samples_per_s=1.0, tokens_per_s=8.0))
    assert section == {"iteration_s": 2.0, "samples_per_s": 1.0, "tokens_per_s": 8.0}


def test_with_estimate_merges_the_price_into_the_plan_once() -> None:
    doc = uniform()
    doc["gpu_types"]["G"]["hourly_usd"] = 2.0
    scenario = parse_scenario(doc)
    parsed = parse_plan(plan(pipeline([stage(["n0:0"], (0, 2))])) | {"estimate": {"note": 1}})
    evaluation = evaluate(scenario, parsed)
    priced = with_estimate(parsed, evaluation)
    assert priced.estimate is not None
    assert priced.estimate["usd_per_hour"] == 2.0 and priced.estimate["note"] == 1
    # Two micro-batches of (1 + 1) ms forward and (2 + 2) ms backward on one GPU at $2/hour.
    assert priced.estimate["usd_per_iteration"] == pytest.approx(2.0 / 3600 * 12e-3)
    assert with_estimate(priced, evaluation) is priced


def test_a_plan_that_never_finishes_has_no_price_per_token() -> None:
    """A link of a vanishing (yet positive) bandwidth makes a transfer, and the iteration,
    infinite (a fuzzed link upload found it): no tokens, so no price per token or per
    iteration, and no division by zero."""
    doc = uniform()
    doc["gpu_types"]["G"]["hourly_usd"] = 2.0
    doc["cluster"]["intra_node"]["G"]["bandwidth_gb_per_s"] = 5e-324
    two_stages = pipeline([stage(["n0:0"], (0, 1)), stage(["n0:1"], (1, 2))])
    evaluation = evaluate(parse_scenario(doc), parse_plan(plan(two_stages)))
    assert evaluation.iteration_s == float("inf") and evaluation.tokens_per_s == 0.0
    assert evaluation.usd_per_hour == 4.0  # two GPUs at $2/hour
    assert evaluation.usd_per_million_tokens is None and evaluation.usd_per_iteration is None
