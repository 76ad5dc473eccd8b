"""The search with schedules beyond the job's: interleaving, recomputation, local learning."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Any

import pytest

from planner import SearchOptions, evaluate, parse_plan, parse_scenario, plan
from planner.documents import Plan, Scenario, Schedule
from planner.errors import Infeasible, InvalidScenario
from planner.estimate import Evaluation
from planner.search import api as search_api
from planner.search.baselines import launcher_baselines, per_type_candidates
from planner.search.drafts import Candidate
from planner.search.exact import TooLargeForExact
from planner.search.grids import grid_candidates
from planner.search.schedules import (
    LOCAL_TRAINING_NOTE,
    _micro_batches_for_interleaving,
    common_blocks,
    schedule_variants,
)
from planner.search.tables import compile_tables
from planner.search.templates import generate_templates
from tests.planner import scenarios as hand
from tests.planner.scenarios import deep

SCENARIOS = Path(__file__).parents[1] / "data" / "scenarios"
QUICK = 3.0  # seconds: these scenarios are small


def memory_bound_deep(num_layers: int, **job: Any) -> dict[str, Any]:
    """`deep` with 2e8 parameters per layer: at 18 bytes of state per parameter a 10 GiB GPU
    holds two layers, so 16 layers need a pipeline of 8 stages on the 8 GPUs."""
    doc = deep(num_layers, **job)
    doc["model"]["kinds"]["b"]["params"] = 200_000_000
    return doc


def two_types(num_layers: int, **job: Any) -> dict[str, Any]:
    """`deep` on one node of G and one of H, H twice as fast for every kind."""
    doc = deep(num_layers, **job)
    doc["gpu_types"]["H"] = {"memory_gib": 10}
    doc["cluster"]["nodes"][1]["gpu_type"] = "H"
    doc["cluster"]["intra_node"]["H"] = doc["cluster"]["intra_node"]["G"]
    doc["profiles"] += [dict(row, gpu_type="H", forward_ms=row["forward_ms"] / 2,
                             backward_ms=row["backward_ms"] / 2) for row in doc["profiles"]]
    return doc


def chunk_counts(plan_doc: Plan) -> set[int]:
    return {stage.num_chunks for p in plan_doc.pipelines for stage in p.stages}


def test_interleaving_wins_on_a_deep_pipeline_with_few_micro_batches() -> None:
    scenario = parse_scenario(memory_bound_deep(16, global_batch_size=8))
    plain = plan(scenario, SearchOptions(time_limit_s=QUICK))
    assert [len(p.stages) for p in plain.plan.pipelines] == [8]  # memory allows no less
    allowed = plan(scenario, SearchOptions(
        time_limit_s=QUICK, schedules=(Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED_1F1B)))
    assert allowed.plan.schedule is Schedule.INTERLEAVED_1F1B
    assert max(chunk_counts(allowed.plan)) >= 2
    # Judged again from the document alone: valid, and faster than the 1F1B plan.
    again = evaluate(scenario, allowed.plan)
    assert again.valid, again.errors
    assert again.iteration_s == pytest.approx(allowed.evaluation.iteration_s)
    assert again.iteration_s < plain.evaluation.iteration_s * 0.9


def test_an_interleaved_job_gets_a_valid_interleaved_plan() -> None:
    scenario = parse_scenario(memory_bound_deep(16, global_batch_size=8,
                                                schedule="interleaved-1f1b"))
    result = plan(scenario, SearchOptions(time_limit_s=QUICK))
    assert result.plan.schedule is Schedule.INTERLEAVED_1F1B
    assert evaluate(scenario, result.plan).valid


def recompute_tight(**job: Any) -> dict[str, Any]:
    """`deep(2)` profiled at micro-batch 4 too: 1.5x the time of micro-batch 1 (2.7x the
    samples per second) but 6e9 activation bytes per layer, so that a stage holding both
    layers, or one layer for two micro-batches in flight, overflows 10 GiB unless it
    recomputes (then it keeps one layer's activations and the inputs)."""
    doc = deep(2, **job)
    doc["profiles"].append({"gpu_type": "G", "kind": "b", "micro_batch": 4, "tp": 1,
                            "forward_ms": 1.5, "backward_ms": 3.0,
                            "activation_bytes": 6_000_000_000})
    doc["profiles"].append({"gpu_type": "G", "kind": "h", "micro_batch": 4, "tp": 1,
                            "forward_ms": 0.5, "backward_ms": 0.5, "activation_bytes": 500_000})
    return doc


def test_recomputation_wins_when_it_lets_micro_batches_grow() -> None:
    scenario = parse_scenario(recompute_tight(global_batch_size=32))
    plain = plan(scenario, SearchOptions(time_limit_s=QUICK))
    assert {p.micro_batch_size for p in plain.plan.pipelines} == {1}  # b = 4 fits nowhere
    allowed = plan(scenario, SearchOptions(time_limit_s=QUICK, recompute=True))
    recomputing = [s for p in allowed.plan.pipelines for s in p.stages if s.recompute]
    assert recomputing
    assert {p.micro_batch_size for p in allowed.plan.pipelines} == {4}
    again = evaluate(scenario, allowed.plan)
    assert again.valid, again.errors
    assert again.iteration_s < plain.evaluation.iteration_s * 0.8
    # Without recomputation the same plan overflows memory.
    plain_stages = Plan.model_validate(json.loads(allowed.plan.model_dump_json().replace(
        '"recompute":true', '"recompute":false')))
    assert not evaluate(scenario, plain_stages).valid


@pytest.mark.parametrize("max_blocks", [1, 2, 3, None])
def test_local_plans_share_their_blocks_and_respect_the_block_cap(max_blocks: int | None) -> None:
    scenario = parse_scenario(two_types(8, global_batch_size=16, schedule="local",
                                        local_head_kind="h"))
    result = plan(scenario, SearchOptions(time_limit_s=QUICK, max_local_blocks=max_blocks))
    pipelines = result.plan.pipelines
    blocks = {tuple(s.layers for s in p.stages) for p in pipelines}
    assert len(blocks) == 1
    assert max_blocks is None or len(pipelines[0].stages) <= max_blocks
    assert result.plan.schedule is Schedule.LOCAL
    assert result.plan.search["training"] == LOCAL_TRAINING_NOTE  # type: ignore[attr-defined]
    assert evaluate(scenario, result.plan).valid


def test_local_blocks_are_shared_where_the_fastest_types_would_split_differently() -> None:
    """Memory-bound layers on two speeds: each type alone would cut elsewhere; the plan
    keeps one cut for both and stays valid."""
    doc = two_types(16, global_batch_size=8, schedule="local", local_head_kind="h")
    doc["model"]["kinds"]["b"]["params"] = 200_000_000
    scenario = parse_scenario(doc)
    result = plan(scenario, SearchOptions(time_limit_s=QUICK))
    assert len({tuple(s.layers for s in p.stages) for p in result.plan.pipelines}) == 1
    assert evaluate(scenario, result.plan).valid


@pytest.mark.parametrize("schedule", ["local", "1f1b"])
def test_local_jobs_also_allocate_over_shallow_templates(
        monkeypatch: pytest.MonkeyPatch, schedule: str) -> None:
    """Every block but the last trains a head that the templates leave out, so the
    allocation over all of them favours deep pipelines: a local job also gets runs over
    the templates of at most 2 and at most 4 stages. Other jobs get the one run."""
    doc = two_types(16, global_batch_size=8, schedule=schedule, local_head_kind="h")
    scenario = parse_scenario(doc)
    deepest: list[int] = []
    real = search_api.allocation_candidates

    def recorded(tables: Any, templates: list[Any], **kwargs: Any) -> Any:
        deepest.append(max(t.num_stages for t in templates))
        return real(tables, templates, **kwargs)

    monkeypatch.setattr(search_api, "allocation_candidates", recorded)
    plan(scenario, SearchOptions(time_limit_s=QUICK))
    assert deepest[0] > 4  # all templates first
    assert deepest[1:] == ([2, 4] if schedule == "local" else [])


def test_local_in_the_options_of_a_job_that_is_not_local_is_refused() -> None:
    scenario = parse_scenario(deep(4, global_batch_size=8, local_head_kind="h"))
    with pytest.raises(InvalidScenario, match="only a job whose schedule is 'local'"):
        plan(scenario, SearchOptions(schedules=(Schedule.LOCAL,)))


def test_end_to_end_schedules_for_a_local_job_are_refused() -> None:
    scenario = parse_scenario(deep(4, global_batch_size=8, schedule="local",
                                   local_head_kind="h"))
    with pytest.raises(InvalidScenario, match="allow only 'local'"):
        plan(scenario, SearchOptions(schedules=(Schedule.LOCAL, Schedule.ONE_F_ONE_B)))


def test_exact_mode_refuses_a_local_job() -> None:
    scenario = parse_scenario(deep(4, global_batch_size=8, schedule="local",
                                   local_head_kind="h"))
    with pytest.raises(TooLargeForExact, match="'local'"):
        plan(scenario, SearchOptions(exact=True))


def test_a_block_cap_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_local_blocks is 0"):
        SearchOptions(max_local_blocks=0)


def test_naming_the_jobs_own_schedule_leaves_the_plan_unchanged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The default search never builds variants: 1F1B plans are the search's own."""
    def no_variants(*args: object, **kwargs: object) -> None:
        raise AssertionError("schedule variants built for a search that allows none")

    monkeypatch.setattr(search_api, "schedule_variants", no_variants)
    scenario = parse_scenario(json.loads((SCENARIOS / "a80x16-v32x16-gpt1.3b.json").read_text()))
    default = plan(scenario, SearchOptions(time_limit_s=QUICK))
    named = plan(scenario, SearchOptions(time_limit_s=QUICK, schedules=(Schedule.ONE_F_ONE_B,)))
    assert named.plan.pipelines == default.plan.pipelines
    assert named.plan.schedule == default.plan.schedule


def test_common_blocks_cut_where_the_slowest_pipeline_balances_with_its_head() -> None:
    """Two 2-stage pipelines, one on G and one on H (twice as fast), 8 layers of 3 ms per
    micro-batch on G, 2 micro-batches each. The slowest stage over both pipelines is G's:
    with n layers on stage 0 it takes 2 * (3n + 1) ms (the head's 1 ms counted), stage 1
    2 * 3 * (8 - n) ms: n = 4 gives max(26, 24), n = 3 gives max(20, 30), so [0, 4, 8]
    although each pipeline's own split was different."""
    scenario = parse_scenario(two_types(8, global_batch_size=4, schedule="local",
                                        local_head_kind="h"))

    def pipeline(gpu_type: str, node: str, cut: int) -> dict[str, Any]:
        return {"micro_batch_size": 1, "num_micro_batches": 2, "stages": [
            {"gpu_type": gpu_type, "tp": 1, "gpus": [f"{node}:0"], "layers": [0, cut]},
            {"gpu_type": gpu_type, "tp": 1, "gpus": [f"{node}:1"], "layers": [cut, 8]}]}

    uneven = Plan.model_validate({"format": "hetplan-plan/1", "schedule": "local", "pipelines": [
        pipeline("G", "n0", 2), pipeline("H", "n1", 6)]})
    assert not evaluate(scenario, uneven).valid  # the blocks differ
    [shared] = common_blocks(compile_tables(scenario),
                             [Candidate.of(uneven, quick_s=1.0, origin="hand-made")])
    assert [[s.layers for s in p.stages] for p in shared.plan.pipelines] == [
        [(0, 4), (4, 8)], [(0, 4), (4, 8)]]
    assert evaluate(scenario, shared.plan).valid


def test_common_blocks_count_each_shape_at_its_most_micro_batches() -> None:
    """Two G pipelines with 3 and 1 micro-batches and an H pipeline with 2, H's head 10 ms
    per micro-batch (G's 1 ms). With n layers on stage 0 the G pipeline of 3 takes
    max(3 (3n + 1), 9 (8 - n)) ms and H's max(2 (1.5n + 10), 3 (8 - n)): n = 4 (39 ms)
    is the least. Counting G's shape at 1 micro-batch (its last replica's) would put H's
    head first and give n = 1, where G's 3 micro-batches take 63 ms."""
    doc = two_types(8, global_batch_size=6, schedule="local", local_head_kind="h")
    for row in doc["profiles"]:
        if row["gpu_type"] == "H" and row["kind"] == "h":
            row.update(forward_ms=5.0, backward_ms=5.0)
    scenario = parse_scenario(doc)

    def pipeline(gpu_type: str, gpus: list[str], m: int) -> dict[str, Any]:
        return {"micro_batch_size": 1, "num_micro_batches": m, "stages": [
            {"gpu_type": gpu_type, "tp": 1, "gpus": [gpus[0]], "layers": [0, 2]},
            {"gpu_type": gpu_type, "tp": 1, "gpus": [gpus[1]], "layers": [2, 8]}]}

    mixed = Plan.model_validate({"format": "hetplan-plan/1", "schedule": "local", "pipelines": [
        pipeline("G", ["n0:0", "n0:1"], 3), pipeline("G", ["n0:2", "n0:3"], 1),
        pipeline("H", ["n1:0", "n1:1"], 2)]})
    [shared] = common_blocks(compile_tables(scenario),
                             [Candidate.of(mixed, quick_s=1.0, origin="hand-made")])
    assert {tuple(s.layers for s in p.stages) for p in shared.plan.pipelines} == {
        ((0, 4), (4, 8))}
    evaluation = evaluate(scenario, shared.plan)
    assert evaluation.valid


def test_blocks_are_shared_by_the_best_candidates_that_can_share_them() -> None:
    """The search mixes depths by GPU type: candidates of mixed depths ahead in the quick
    ranking do not use up the limit."""
    scenario = parse_scenario(deep(8, global_batch_size=4, schedule="local",
                                   local_head_kind="h"))

    def candidate(depths: list[int], quick_s: float) -> Candidate:
        pipelines = [{"micro_batch_size": 1, "num_micro_batches": 2, "stages": [
            {"gpu_type": "G", "tp": 1, "gpus": [f"n{p}:{s}"],
             "layers": [s * 8 // depth, (s + 1) * 8 // depth]} for s in range(depth)]}
            for p, depth in enumerate(depths)]
        return Candidate.of(Plan.model_validate({"format": "hetplan-plan/1", "schedule": "local",
                                                 "pipelines": pipelines}),
                            quick_s=quick_s, origin=f"depths {depths}")

    mixed = [candidate([2, 4], 1.0), candidate([4, 2], 1.5)]
    same = [candidate([2, 2], 3.0), candidate([4, 4], 2.0)]
    shared = common_blocks(compile_tables(scenario), [*mixed, *same], limit=1)
    assert [c.origin for c in shared] == ["depths [4, 4]"]


@pytest.mark.parametrize("max_blocks", [1, 3])
def test_every_candidate_source_builds_within_the_block_cap(max_blocks: int) -> None:
    """The cap bounds what is built, not only what is kept: the templates, the per-type
    baseline, the launcher baselines and the grids of a fleet that could host 16 blocks
    build none deeper (and so cost less time than uncapped)."""
    doc = two_types(16, global_batch_size=16, schedule="local", local_head_kind="h")
    scenario = parse_scenario(doc)
    uncapped = compile_tables(scenario)
    capped = compile_tables(scenario, max_stages=max_blocks)
    assert (uncapped.max_stages, capped.max_stages) == (16, max_blocks)

    def depths(tables: Any) -> set[int]:
        templates = generate_templates(tables, Schedule.LOCAL)
        candidates = [*per_type_candidates(tables),
                      *grid_candidates(tables).even,
                      *grid_candidates(tables).with_idle,
                      *(c for group in launcher_baselines(tables).values() for c in group)]
        return ({t.num_stages for t in templates}
                | {len(p.stages) for c in candidates for p in c.plan.pipelines})

    assert max(depths(uncapped)) > max_blocks  # the fleet would build deeper
    assert max(depths(capped)) <= max_blocks


def test_a_local_plan_is_the_best_of_the_candidates_given_shared_blocks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The quick estimates leave out local learning's heads and the shared split: every
    candidate given one is judged (on the WAN scenario, with a head derived as the bench
    derives it, the fastest is outside the first eight by quick estimate)."""
    from bench.schedules import with_local_head

    doc = json.loads((SCENARIOS / "h100x16east-a80x32west-gpt6.7b-wan.json").read_text())
    scenario = parse_scenario(with_local_head(doc))
    given: list[Candidate] = []
    real = search_api.common_blocks

    def recorded(*args: Any, **kwargs: Any) -> list[Candidate]:
        given.extend(real(*args, **kwargs))
        return given

    monkeypatch.setattr(search_api, "common_blocks", recorded)
    found = plan(scenario, SearchOptions(time_limit_s=QUICK)).evaluation.samples_per_s
    rates = [e.samples_per_s for c in given if (e := evaluate(scenario, c.plan)).valid]
    assert len(rates) > 8  # more than the finalists of other jobs
    assert found is not None and found >= max(r for r in rates if r is not None) * (1 - 1e-9)


def two_stages_of_four_layers() -> Plan:
    """A 1F1B plan on `deep(8)`: one pipeline, stages [0, 4) and [4, 8), 2 micro-batches."""
    return Plan.model_validate({"format": "hetplan-plan/1", "schedule": "1f1b", "pipelines": [{
        "micro_batch_size": 1, "num_micro_batches": 2, "stages": [
            {"gpu_type": "G", "tp": 1, "gpus": ["n0:0"], "layers": [0, 4]},
            {"gpu_type": "G", "tp": 1, "gpus": ["n0:1"], "layers": [4, 8]}]}]})


def test_interleaving_lays_out_each_stages_chunks_in_model_order() -> None:
    """Two stages of 4 uniform layers each, v = 2: chunk j of stage s is model chunk
    2j + s, two layers each, so stage 0 holds [0, 2) and [4, 6)."""
    scenario = parse_scenario(deep(8, global_batch_size=2))
    base = two_stages_of_four_layers()
    found = schedule_variants(
        scenario, compile_tables(scenario),
        [(Candidate.of(base, quick_s=1.0, origin="hand-made"), evaluate(scenario, base))],
        (Schedule.INTERLEAVED_1F1B,), recompute=False, deadline=math.inf)
    assert found is not None
    [pipeline] = found[0].plan.pipelines
    v = pipeline.stages[0].num_chunks
    size = 4 // v  # layers per chunk
    assert v >= 2 and found[1].iteration_s < evaluate(scenario, base).iteration_s
    for s, stage in enumerate(pipeline.stages):
        starts = [(j * 2 + s) * size for j in range(v)]
        assert stage.ranges == [(a, a + size) for a in starts]
    assert found[1].valid


def test_micro_batches_round_to_the_depth_and_the_shallowest_pipeline_takes_the_rest() -> None:
    """A 4-stage pipeline of 7 micro-batches rounds to 8 (3 of 4 past the lower multiple);
    the 2-stage one, shallowest, gives up the sample: 5 - 1 = 4. The batch stays 12."""
    def pipeline(node: str, depth: int, m: int) -> dict[str, Any]:
        return {"micro_batch_size": 1, "num_micro_batches": m, "stages": [
            {"gpu_type": "G", "tp": 1, "gpus": [f"{node}:{s}"], "layers": [s, s + 1]}
            for s in range(depth)]}

    plan_doc = Plan.model_validate({"format": "hetplan-plan/1", "pipelines": [
        pipeline("n0", 4, 7), pipeline("n1", 2, 5)]})
    rounded = _micro_batches_for_interleaving(plan_doc)
    assert rounded is not None
    assert [p.num_micro_batches for p in rounded.pipelines] == [8, 4]
    already = plan_doc.model_copy(update={"pipelines": [
        plan_doc.pipelines[0].model_copy(update={"num_micro_batches": 8}),
        plan_doc.pipelines[1]]})
    assert _micro_batches_for_interleaving(already) is None  # nothing to round


def test_a_block_cap_too_low_for_memory_names_the_cap() -> None:
    """16 layers of 2e8 parameters need 8 blocks on 10 GiB GPUs: a cap of 2 leaves none."""
    doc = memory_bound_deep(16, global_batch_size=8, schedule="local", local_head_kind="h")
    with pytest.raises(Infeasible, match=r"at most 2 block\(s\) \(max_local_blocks\)"):
        plan(parse_scenario(doc), SearchOptions(time_limit_s=QUICK, max_local_blocks=2))


def test_past_its_deadline_the_variant_step_still_gives_a_plan_of_an_allowed_schedule() -> None:
    scenario = parse_scenario(deep(8, global_batch_size=2, schedule="interleaved-1f1b"))
    base = two_stages_of_four_layers()
    found = schedule_variants(
        scenario, compile_tables(scenario),
        [(Candidate.of(base, quick_s=1.0, origin="hand-made"), evaluate(scenario, base))],
        (Schedule.INTERLEAVED_1F1B,), recompute=False, deadline=0.0)
    assert found is not None and found[0].plan.schedule is Schedule.INTERLEAVED_1F1B
    assert found[1].valid


@pytest.mark.parametrize("name", ["l40sx16-a40x8-v32x16-t4x8-gpt2.7b", "h100x16-a10x32-llama7b"])
def test_recomputing_where_memory_is_full_never_makes_a_plan_faster(name: str) -> None:
    # Why a variant over memory that is already no faster than the best is not repaired.
    from planner.search.schedules import _larger_micro_batches, _recompute_where_full

    scenario = parse_scenario(json.loads((SCENARIOS / f"{name}.json").read_text()))
    tables = compile_tables(scenario)
    base = plan(scenario, SearchOptions(time_limit_s=QUICK)).plan
    repaired_some = False
    for factor in (2, 4, 8):
        larger = _larger_micro_batches(tables, base, factor)
        if larger is None:
            continue
        over = evaluate(scenario, larger)
        repaired = None if over.valid else _recompute_where_full(larger, over)
        if repaired is None or over.iteration_s is None:
            continue
        again = evaluate(scenario, repaired)
        assert again.iteration_s is not None
        assert again.iteration_s >= over.iteration_s
        repaired_some = True
    assert repaired_some


def _counted(judged: list[Plan], scenario: Scenario, plan_doc: Plan) -> Evaluation:
    judged.append(plan_doc)
    return evaluate(scenario, plan_doc)


def two_pipelines_with_slow_rings() -> tuple[Scenario, Plan]:
    """Two 2-stage pipelines on two nodes, each layer 1e8 parameters: every ring crosses
    the 10 GB/s link between the nodes, 0.08 s of sync. Micro-batches of 2 run faster (3 ms
    forward, 1.5 ms backward per layer) but overflow the first stage's memory, and recomputing
    its forwards makes that stage slower than the base plan's pipelines."""
    doc = deep(4, global_batch_size=16)
    doc["model"]["kinds"]["b"]["params"] = 100_000_000
    doc["profiles"].append({"gpu_type": "G", "kind": "b", "micro_batch": 2, "tp": 1,
                            "forward_ms": 3, "backward_ms": 1.5,
                            "activation_bytes": 2_000_000_000})
    base = parse_plan(hand.plan(
        hand.pipeline([hand.stage(["n0:0"], (0, 2)), hand.stage(["n0:1"], (2, 4))], m=8),
        hand.pipeline([hand.stage(["n1:0"], (0, 2)), hand.stage(["n1:1"], (2, 4))], m=8)))
    return parse_scenario(doc), base


def test_a_variant_keeping_its_bases_stages_is_known_to_sync_as_the_base() -> None:
    from planner.search.schedules import _known_sync_s, _variants

    scenario, base = two_pipelines_with_slow_rings()
    known = evaluate(scenario, base)
    assert known.sync_s == pytest.approx(0.08)
    claimed = {}
    for variant, origin in _variants(compile_tables(scenario),
                                     Candidate.of(base, quick_s=1.0, origin="hand-made"),
                                     (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED_1F1B), True):
        claimed[origin] = _known_sync_s(base, known, variant)
        if claimed[origin] > 0:
            assert evaluate(scenario, variant).sync_s == pytest.approx(claimed[origin],
                                                                       rel=1e-12)
    # Another schedule and larger micro-batches keep the stages; chunks move the layers.
    assert claimed["hand-made, micro-batches x2 with recomputation"] == known.sync_s
    assert claimed["hand-made, interleaved with 2 chunks per stage"] == 0.0


def test_variants_whose_floor_and_known_sync_lose_are_not_simulated(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The repair of the larger micro-batches (a floor of 0.06 s, under the best
    plan's 0.13 s) cannot win once its 0.08 s of sync is counted: the same plan wins with
    that floor as without it, for fewer evaluations."""
    from planner.search import schedules

    scenario, base = two_pipelines_with_slow_rings()
    bases = [(Candidate.of(base, quick_s=1.0, origin="hand-made"), evaluate(scenario, base))]
    count, found = _variants_judged(monkeypatch, scenario, bases)
    with_sync = schedules._cannot_win
    monkeypatch.setattr(schedules, "_cannot_win",
                        lambda s, p, sync_s, best: with_sync(s, p, 0.0, best))
    count_without, found_without = _variants_judged(monkeypatch, scenario, bases)
    assert found == found_without
    assert found.schedule is Schedule.INTERLEAVED_1F1B
    assert count < count_without


def test_variants_slower_than_the_best_at_their_floor_are_not_simulated(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same variant wins with the bound as without it, for fewer evaluations."""
    from planner.search import schedules

    scenario = parse_scenario(json.loads(
        (SCENARIOS / "v16x32-a10x16-llama7b-memtight.json").read_text()))
    base = plan(scenario, SearchOptions(time_limit_s=QUICK)).plan
    bases = [(Candidate.of(base, quick_s=1.0, origin="searched"), evaluate(scenario, base))]
    count, found = _variants_judged(monkeypatch, scenario, bases)
    monkeypatch.setattr(schedules, "iteration_floor_s", lambda s, p: None)
    count_without, found_without = _variants_judged(monkeypatch, scenario, bases)
    assert found == found_without
    assert count < count_without


def test_the_fill_in_the_floor_spares_more_simulations_than_the_busiest_stage_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Larger micro-batches cut a pipeline's busiest stage but lengthen its fill: counting
    the fill screens out more of them (5 simulations to 2 here), and the same plan wins."""
    from planner import bounds

    scenario = parse_scenario(json.loads(
        (SCENARIOS / "v16x32-a10x16-llama7b-memtight.json").read_text()))
    base = plan(scenario, SearchOptions(time_limit_s=QUICK)).plan
    bases = [(Candidate.of(base, quick_s=1.0, origin="searched"), evaluate(scenario, base))]
    count, found = _variants_judged(monkeypatch, scenario, bases)

    def busiest_stage_only(forward: list[float], backward: list[float], transfer: list[float],
                           num_stages: int, m: int, schedule: Schedule, *,
                           blocking_transfers: bool) -> float:
        busy = [0.0] * num_stages
        for c, (f, b) in enumerate(zip(forward, backward, strict=True)):
            busy[c % num_stages] += f + b
        return m * max(busy)

    monkeypatch.setattr(bounds, "floor_s", busiest_stage_only)
    count_busiest, found_busiest = _variants_judged(monkeypatch, scenario, bases)
    assert found == found_busiest
    assert count < count_busiest


def _variants_judged(monkeypatch: pytest.MonkeyPatch, scenario: Scenario,
                     bases: list[tuple[Candidate, Evaluation]]) -> tuple[int, Plan]:
    """How many plans the variant step simulates from `bases` (1F1B, interleaving and
    recomputation allowed), and the plan it returns."""
    from planner.search import schedules

    judged: list[Plan] = []
    monkeypatch.setattr(schedules, "evaluate", functools.partial(_counted, judged))
    best = schedule_variants(scenario, compile_tables(scenario), bases,
                             (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED_1F1B), recompute=True,
                             deadline=math.inf)
    assert best is not None
    return len(judged), best[0].plan
