"""The search: valid plans, never worse than the baselines, clear infeasibility."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner import Infeasible, SearchOptions, evaluate, parse_plan, parse_scenario, plan
from planner.documents import dump_document
from planner.search import api
from planner.search.aside import Aside
from planner.search.drafts import Candidate
from planner.search.judging import (
    FAMILY_FINALISTS,
    POLISH_RUNNER_UP,
    REFINE_SLACK,
    RUNNER_UP_POLISHED_UP_TO_GPUS,
    baseline_finalists,
    finalists,
    worth_polishing,
    worth_refining,
)
from planner.search.templates import even_bounds
from tests.planner.scenarios import tiny

DATA = Path(__file__).parent.parent / "data"


def test_even_bounds_give_earlier_stages_the_extra_layers() -> None:
    assert even_bounds(26, 3) == [0, 9, 18, 26]
    assert even_bounds(34, 4) == [0, 9, 18, 26, 34]


def test_plan_of_a_shared_scenario_is_valid_and_beats_the_reference_baselines() -> None:
    name = "a80x16-v32x16-gpt1.3b"
    scenario = parse_scenario(json.loads((DATA / "scenarios" / f"{name}.json").read_text()))
    summary = json.loads((DATA / "reference" / f"{name}.summary.json").read_text())
    result = plan(scenario, SearchOptions(time_limit_s=4))
    # The written document round-trips and re-evaluates to the same numbers.
    again = evaluate(scenario, parse_plan(json.loads(json.dumps(dump_document(result.plan)))))
    assert again.valid, again.errors
    assert again.iteration_s == pytest.approx(result.evaluation.iteration_s)
    best = max(summary["homogeneous"]["samples_per_s"], summary["unaware"]["samples_per_s"])
    assert again.samples_per_s >= best * (1 - 1e-9)
    search = result.plan.model_extra["search"]
    assert search["status"] in {"feasible", "heuristic"}
    assert 0 <= search["gap_to_compute_bound"] < 1


def test_infeasible_scenario_names_the_memory_it_needs() -> None:
    doc = tiny()
    doc["gpu_types"]["G"]["memory_gib"] = 2.01  # 2 GiB reserved; layers need ~18 MB each
    with pytest.raises(Infeasible, match=r"needs .* GiB .* largest GPU has 2.01 GiB"):
        plan(parse_scenario(doc), SearchOptions(time_limit_s=2))


@st.composite
def small_scenarios(draw: st.DrawFn) -> dict:
    doc = tiny()
    types = {"G": 10.0, "S": draw(st.sampled_from([0.5, 2.2, 4.0]))}
    doc["gpu_types"] = {"G": {"memory_gib": 10}, "S": {"memory_gib": 2 + types["S"]}}
    doc["cluster"]["nodes"] = [
        {"name": "n0", "gpu_type": "G", "gpus": draw(st.sampled_from([1, 2, 4]))},
        {"name": "s0", "gpu_type": "S", "gpus": draw(st.sampled_from([1, 2, 4])),
         "nics": draw(st.sampled_from([1, 4]))},
    ]
    doc["cluster"]["intra_node"]["S"] = {"bandwidth_gb_per_s": 50, "latency_us": 2}
    slow = draw(st.floats(min_value=1.0, max_value=4.0))
    num_layers = draw(st.integers(min_value=2, max_value=6))
    doc["model"]["layers"] = ["a"] + ["b"] * (num_layers - 1)
    rows = []
    for gpu_type, factor in (("G", 1.0), ("S", slow)):
        for b in (1, 2):
            for kind, f, act in (("a", 1.0, 1e6), ("b", 2.0, 2e6)):
                rows.append({"gpu_type": gpu_type, "kind": kind, "micro_batch": b, "tp": 1,
                             "forward_ms": f * b * factor, "backward_ms": 2 * f * b * factor,
                             "activation_bytes": act * b})
    doc["profiles"] = rows
    doc["job"]["global_batch_size"] = draw(st.sampled_from([4, 8, 16]))
    doc["job"]["schedule"] = draw(st.sampled_from(["1f1b", "gpipe"]))
    return doc


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_scenarios())
def test_every_returned_plan_is_valid_and_never_worse_than_any_baseline(doc: dict) -> None:
    scenario = parse_scenario(doc)
    try:
        result = plan(scenario, SearchOptions(time_limit_s=1))
    except Infeasible:
        return
    again = evaluate(scenario, result.plan)
    assert again.valid, again.errors
    for name, rate in result.baselines.items():
        if rate is not None:
            assert again.samples_per_s >= rate * (1 - 1e-9), name


def test_a_progress_callback_that_raises_cancels_the_search() -> None:
    scenario = parse_scenario(json.loads((DATA / "scenarios" / "a80x16-v32x16-gpt1.3b.json").read_text()))
    seen: list[float] = []

    class Cancelled(Exception):
        pass

    def cancel_after_templates(fraction: float, message: str) -> None:
        seen.append(fraction)
        if "allocating" in message:
            raise Cancelled

    with pytest.raises(Cancelled):
        plan(scenario, SearchOptions(time_limit_s=4), progress=cancel_after_templates)
    assert seen == sorted(seen) and seen[-1] < 1.0


def test_the_garbage_collector_runs_rarely_during_a_search_and_as_before_after() -> None:
    import gc

    from planner.search.api import SEARCH_GC_THRESHOLDS

    scenario = parse_scenario(tiny())
    before = gc.get_threshold()
    seen: list[tuple[int, ...]] = []
    plan(scenario, progress=lambda fraction, message: seen.append(gc.get_threshold()))
    assert seen and all(t == SEARCH_GC_THRESHOLDS for t in seen)
    assert gc.get_threshold() == before
    assert gc.isenabled()


def test_concurrent_searches_restore_the_collector_only_when_the_last_one_ends() -> None:
    import gc
    import threading

    from planner.search.api import SEARCH_GC_THRESHOLDS

    scenario = parse_scenario(tiny())
    before = gc.get_threshold()
    both_running = threading.Barrier(2)
    short_done = threading.Event()
    seen_by_long: list[tuple[int, ...]] = []

    def long_search(fraction: float, message: str) -> None:
        if fraction == 0.0:
            both_running.wait(timeout=30)
        if fraction == 1.0:  # the short search has ended; this one still runs
            short_done.wait(timeout=30)
            seen_by_long.append(gc.get_threshold())

    def short_search() -> None:
        plan(scenario, None, lambda fraction, message: fraction == 0.0 and both_running.wait(30))
        short_done.set()

    threads = [threading.Thread(target=plan, args=(scenario, None, long_search)),
               threading.Thread(target=short_search)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert seen_by_long == [SEARCH_GC_THRESHOLDS]
    assert gc.get_threshold() == before


def test_allocations_solved_side_by_side_give_the_same_plan() -> None:
    name = "l40sx16-a40x8-v32x16-t4x8-gpt2.7b"
    scenario = parse_scenario(json.loads((DATA / "scenarios" / f"{name}.json").read_text()))
    one = plan(scenario, SearchOptions(parallel_allocations=1))
    two = plan(scenario, SearchOptions(parallel_allocations=2))
    assert one.evaluation.iteration_s == two.evaluation.iteration_s
    assert [p.model_dump() for p in one.plan.pipelines] == [p.model_dump() for p in two.plan.pipelines]


def test_each_family_of_candidates_has_its_best_judged_however_the_others_are_quoted() -> None:
    """Ten grids quoted below every allocation fill the eight finalists by quick estimate
    alone; the allocation's best two are judged too, and its third is not."""
    def candidate(quick_s: float, origin: str) -> Candidate:
        return Candidate(build=lambda: pytest.fail("judging needs no plan built"),
                         quick_s=quick_s, origin=origin)

    grids = [candidate(1.0 + i / 100, f"grid {i}") for i in range(10)]
    allocated = [candidate(2.0 + i / 100, f"allocation {i}") for i in range(3)]
    chosen = finalists([*allocated, *grids], [allocated, [], grids], limit=8)
    assert [c.origin for c in chosen] == [f"grid {i}" for i in range(8)] + [
        f"allocation {i}" for i in range(FAMILY_FINALISTS)]
    assert finalists([*allocated, *grids], [], limit=8) == grids[:8]


def test_a_family_whose_best_draft_takes_both_places_has_its_second_draft_judged() -> None:
    """A family's best two candidates are one draft placed both ways: the best placement of
    its second draft is judged too (and nothing of its third)."""
    def candidate(quick_s: float, origin: str, draft: int | None) -> Candidate:
        return Candidate(build=lambda: pytest.fail("judging needs no plan built"),
                         quick_s=quick_s, origin=origin, placement_of=draft)

    grids = [candidate(1.0 + i / 100, f"grid {i}", None) for i in range(10)]
    allocated = [candidate(2.0, "A pipeline-major", 7), candidate(2.0, "A stage-major", 7),
                 candidate(2.01, "B stage-major", 8), candidate(2.02, "B pipeline-major", 8),
                 candidate(2.03, "C pipeline-major", 9)]
    chosen = finalists([*allocated, *grids], [allocated, grids], limit=8)
    assert [c.origin for c in chosen] == [f"grid {i}" for i in range(8)] + [
        "A pipeline-major", "A stage-major", "B stage-major"]


def test_refinement_takes_the_best_three_and_each_other_close_drafts_best_placement() -> None:
    """Shares set by simulation can reorder drafts judged close together: past the best
    three, the best placement of every other draft within REFINE_SLACK is refined too, and
    nothing beyond it."""
    def judged(seconds: float, origin: str, draft: int | None) -> tuple[float, Candidate, Any]:
        candidate = Candidate(build=lambda: pytest.fail("choosing needs no plan built"),
                              quick_s=seconds, origin=origin, placement_of=draft)
        return seconds, candidate, None

    slack = REFINE_SLACK - 1
    valid = [judged(10.0, "A pipeline-major", 1), judged(10.01, "A stage-major", 1),
             judged(10.02, "B", None), judged(10.03, "C stage-major", 2),
             judged(10.04, "B again", None), judged(10.05, "C pipeline-major", 2),
             judged(10.06, "A third", 1), judged(10 * (1 + slack * 0.9), "D", 3),
             judged(10 * (1 + slack * 1.1), "E", 4)]
    chosen = [c.origin for _, c, _ in worth_refining(valid)]
    assert chosen == ["A pipeline-major", "A stage-major", "B", "C stage-major", "B again",
                      "D"]


def test_the_polish_also_climbs_from_the_best_plan_of_another_draft_close_behind() -> None:
    def judged(seconds: float, origin: str, draft: int | None) -> tuple[float, Candidate, Any]:
        candidate = Candidate(build=lambda: pytest.fail("choosing needs no plan built"),
                              quick_s=seconds, origin=origin, placement_of=draft)
        return seconds, candidate, None

    close = 10 * (1 + (POLISH_RUNNER_UP - 1) * 0.5)
    valid = [judged(10.0, "A pipeline-major", 1), judged(10.001, "A stage-major", 1),
             judged(close, "B", 2), judged(close, "C", 3)]
    small, large = RUNNER_UP_POLISHED_UP_TO_GPUS, RUNNER_UP_POLISHED_UP_TO_GPUS + 1
    assert [c.origin for _, c, _ in worth_polishing(valid, small)] == ["A pipeline-major", "B"]
    assert [c.origin for _, c, _ in worth_polishing(valid, large)] == ["A pipeline-major"]
    far = 10 * POLISH_RUNNER_UP * 1.001
    assert [c.origin for _, c, _ in worth_polishing([valid[0], valid[1], judged(far, "B", 2)],
                                                    small)] == ["A pipeline-major"]


def test_what_the_parent_does_while_its_child_works_leaves_the_plan_as_it_was(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A parent that finds its forked child still working builds and judges the launcher
    baselines, computes the bound and judges its own best candidates first. Child early or
    late, the plan and the baselines are the same. (The work aside is taken as forked
    whatever ran it: a fork is refused where other threads run, as in a test session.)"""
    scenario = parse_scenario(json.loads(
        (DATA / "scenarios" / "a80x16-v32x16-gpt1.3b.json").read_text()))
    waited: list[api._Waited] = []
    original = api._while_waiting

    def spied(*args: Any, **kwargs: Any) -> api._Waited:
        waited.append(original(*args, **kwargs))
        return waited[-1]

    monkeypatch.setattr(api, "_while_waiting", spied)
    monkeypatch.setattr(Aside, "forked", property(lambda self: True))
    results = {}
    for child_done in (True, False):
        monkeypatch.setattr(Aside, "done", lambda self, done=child_done: done)
        results[child_done] = plan(scenario, SearchOptions())
    early, late = waited
    assert not early.judged and not early.bound_known and early.launchers is None
    assert late.launchers is not None and late.bound_known
    baseline_judged = sum(len(baseline_finalists(group)) for group in late.launchers.values())
    assert baseline_judged > 0
    assert len(late.judged) == baseline_judged + SearchOptions().finalists
    assert results[True].baselines == results[False].baselines
    ready, busy = (results[done].plan.model_dump(exclude={"search": {"wall_s"}})
                   for done in (True, False))
    assert ready == busy
