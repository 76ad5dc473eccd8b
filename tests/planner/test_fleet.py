"""Money questions over fleets: sub-fleets, the frontier, objectives under budgets, what-if.

The priced scenario (tests/planner/fleet_scenarios.py) plans by hand: one S GPU alone runs
4 micro-batches of 6 ms (166.67 samples/s, $1/hour), one F GPU alone 4 of 3 ms (333.33,
$4/hour), both together split the batch 3:1 (F 9 ms, S 6 ms) and sync 4e6 gradient bytes
over 10 GB/s (0.4 ms): 4 / 9.4 ms = 425.53 samples/s at $5/hour.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import planner
from planner import fleet
from planner.estimate import Evaluation, dominates
from planner.fleet import BudgetNotMet, FleetOutcome, FleetVariant, Objective, ObjectiveOptions
from planner.search import PlanResult, PlanStatus
from tests.planner.fleet_scenarios import priced

OPTIONS = planner.SearchOptions(time_limit_s=1.0)
S_ALONE = 4 / 0.024
F_ALONE = 4 / 0.012
BOTH = 4 / 0.0094


def scenario(fast_nodes: int = 1, slow_nodes: int = 1) -> planner.Scenario:
    return planner.parse_scenario(priced(fast_nodes, slow_nodes))


def objective(**goal: object) -> ObjectiveOptions:
    return ObjectiveOptions(time_limit_s=1.0, **goal)  # type: ignore[arg-type]


def test_sub_fleets_put_whole_type_subsets_first_then_equal_then_mixed_shares() -> None:
    labels = [f.label for f in fleet.sub_fleets(scenario(4, 4))]
    assert labels[:3] == ["F 4/4 nodes, S 4/4 nodes", "F 4/4 nodes", "S 4/4 nodes"]
    assert labels[3:9] == ["F 2/4 nodes, S 2/4 nodes", "F 2/4 nodes", "S 2/4 nodes",
                           "F 1/4 nodes, S 1/4 nodes", "F 1/4 nodes", "S 1/4 nodes"]
    # Mixed shares: {1, 2, 4} nodes of each, less the three equal pairs already listed.
    assert len(labels) == 9 + 6 and len(set(labels)) == len(labels)
    assert [f.label for f in fleet.sub_fleets(scenario(4, 4), max_fleets=2)] == labels[:2]


def test_sub_fleets_keep_the_first_nodes_of_each_type() -> None:
    half = fleet.sub_fleets(scenario(4, 4))[3]
    assert [n.name for n in half.scenario.cluster.nodes] == ["f0", "f1", "s0", "s1"]


def test_frontier_of_the_priced_scenario_is_worked_by_hand() -> None:
    outcomes = fleet.plan_fleets(fleet.sub_fleets(scenario()), OPTIONS)
    points = fleet.frontier(outcomes)
    assert [p.label for p in points] == ["S 1/1 nodes", "F 1/1 nodes", "F 1/1 nodes, S 1/1 nodes"]
    assert [p.usd_per_hour for p in points] == [1.0, 4.0, 5.0]
    assert [p.samples_per_s for p in points] == pytest.approx([S_ALONE, F_ALONE, BOTH])


def _outcome(samples_per_s: float, usd_per_hour: float) -> FleetOutcome:
    plan = planner.parse_plan({"format": "hetplan-plan/1", "pipelines": [
        {"micro_batch_size": 1, "num_micro_batches": 4,
         "stages": [{"gpu_type": "S", "tp": 1, "gpus": ["s0:0"], "layers": [0, 1]}]}]})
    evaluation = Evaluation(valid=True, errors=[], samples_per_s=samples_per_s,
                            usd_per_hour=usd_per_hour)
    result = PlanResult(plan=plan, evaluation=evaluation, status=PlanStatus.HEURISTIC, wall_s=0)
    return FleetOutcome(label=f"{samples_per_s}@{usd_per_hour}", result=result)


points_strategy = st.lists(st.tuples(st.integers(1, 20), st.integers(1, 20)), max_size=25)


@given(points_strategy)
def test_frontier_points_dominate_none_and_every_other_point_is_dominated(
        pairs: list[tuple[int, int]]) -> None:
    outcomes = [_outcome(float(s), float(u)) for s, u in pairs]
    points = fleet.frontier(outcomes)
    assert not any(dominates(a, b) for a in points for b in points)
    kept = {(p.samples_per_s, p.usd_per_hour) for p in points}
    assert len(kept) == len(points)
    for o in outcomes:
        assert (o.samples_per_s, o.usd_per_hour) in kept or any(dominates(p, o) for p in points)
    assert [p.usd_per_hour for p in points] == sorted(p.usd_per_hour for p in points)


def test_cost_objective_picks_least_usd_per_million_tokens() -> None:
    result = fleet.plan_with_objective(scenario(), objective(objective=Objective.COST))
    # S alone: $1/hour at 166.67 samples/s of 8 tokens: 1 / 3600 / 1333.3 * 1e6 = $0.2083.
    assert result.evaluation.usd_per_hour == 1.0
    assert result.evaluation.usd_per_million_tokens == pytest.approx(0.208333, rel=1e-5)
    assert result.plan.search["objective"] == "cost"  # type: ignore[attr-defined]
    assert result.plan.search["fleet"] == "S 1/1 nodes"  # type: ignore[attr-defined]
    assert set(result.unused_gpus) == {"f0:0"}


def test_cost_objective_under_a_floor_takes_the_cheapest_per_token_plan_over_it() -> None:
    # Over 300 samples/s: F alone costs 4 / 3600 / (333.33 * 8) * 1e6 = $0.4167 per million
    # tokens, both GPUs 5 / 3600 / (425.53 * 8) * 1e6 = $0.4080: both win.
    result = fleet.plan_with_objective(scenario(), objective(objective=Objective.COST,
                                                             min_samples_per_s=300))
    assert result.evaluation.samples_per_s == pytest.approx(BOTH)
    assert result.evaluation.usd_per_million_tokens == pytest.approx(0.408, rel=1e-3)


def test_throughput_under_a_budget_takes_the_fastest_plan_within_it() -> None:
    result = fleet.plan_with_objective(scenario(), objective(max_usd_per_hour=4.5))
    assert (result.evaluation.samples_per_s, result.evaluation.usd_per_hour) == (
        pytest.approx(F_ALONE), 4.0)


def test_throughput_without_a_goal_in_money_is_the_search_itself() -> None:
    result = fleet.plan_with_objective(scenario(), objective())
    assert result.evaluation.samples_per_s == pytest.approx(BOTH)
    assert "objective" not in result.plan.search  # type: ignore[attr-defined]


def test_budget_below_every_plan_names_the_cheapest_plan() -> None:
    with pytest.raises(BudgetNotMet, match=r"costs at most \$0\.5/hour.*S 1/1 nodes, reaches "
                       r"166\.7 samples/s at \$1/hour") as caught:
        fleet.plan_with_objective(scenario(), objective(max_usd_per_hour=0.5))
    assert caught.value.closest is not None and caught.value.closest.usd_per_hour == 1.0
    assert isinstance(caught.value, planner.Infeasible)


def test_floor_above_every_plan_names_the_fastest_plan() -> None:
    with pytest.raises(BudgetNotMet, match=r"reaches 1000 samples/s.*F 1/1 nodes, S 1/1 nodes, "
                       r"reaches 425\.5 samples/s at \$5/hour"):
        fleet.plan_with_objective(scenario(), objective(objective=Objective.COST,
                                                        min_samples_per_s=1000))


def test_budget_and_floor_that_exclude_each_other_name_the_nearest_plan() -> None:
    # $4.5 buys at most F alone (333 samples/s); 400 samples/s needs both ($5): F alone is
    # 17 % short, both 11 % over budget.
    with pytest.raises(BudgetNotMet, match=r"the closest, on F 1/1 nodes, S 1/1 nodes"):
        fleet.plan_with_objective(scenario(), objective(max_usd_per_hour=4.5,
                                                        min_samples_per_s=400))


def test_cost_objective_without_prices_names_the_unpriced_type() -> None:
    document = priced()
    del document["gpu_types"]["S"]["hourly_usd"]
    with pytest.raises(planner.InvalidScenario, match=r"gpu_types\.S\.hourly_usd"):
        fleet.plan_with_objective(planner.parse_scenario(document),
                                  objective(objective=Objective.COST))


def test_what_if_reports_each_variant_against_the_base() -> None:
    variants = [FleetVariant(remove_types=["F"]), FleetVariant.model_validate(
        {"name": "two S", "add": [{"gpu_type": "S", "nodes": 1}], "remove_types": ["F"]})]
    base, s_only, two_s = fleet.what_if(scenario(), variants, OPTIONS)
    assert (base.name, base.samples_per_s, base.usd_per_hour) == ("base", pytest.approx(BOTH), 5.0)
    assert s_only.name == "-F" and s_only.num_gpus == 1
    assert s_only.samples_per_s_change == pytest.approx(S_ALONE / BOTH - 1)
    assert s_only.usd_per_hour_change == pytest.approx(1 / 5 - 1)
    # Two S GPUs: 2 micro-batches of 6 ms each, then 0.4 ms of sync: 4 / 12.4 ms, $2/hour.
    assert two_s.name == "two S" and two_s.num_gpus == 2
    assert two_s.samples_per_s == pytest.approx(4 / 0.0124)
    assert two_s.usd_per_hour_change == pytest.approx(2 / 5 - 1)


def test_what_if_with_an_unknown_type_names_the_variant_and_field() -> None:
    with pytest.raises(planner.InvalidScenario, match=r"variants\[0\]\.add\[0\]\.gpu_type"):
        fleet.what_if(scenario(), [FleetVariant.model_validate(
            {"add": [{"gpu_type": "H100", "nodes": 1}]})], OPTIONS)


def test_what_if_removing_more_nodes_than_there_are_is_rejected() -> None:
    with pytest.raises(planner.InvalidScenario, match=r"remove\[0\]\.nodes.*1 S node"):
        fleet.apply_variant(scenario(), FleetVariant.model_validate(
            {"remove": [{"gpu_type": "S", "nodes": 2}]}))


def test_what_if_removing_every_node_is_rejected() -> None:
    with pytest.raises(planner.InvalidScenario, match="removes every node"):
        fleet.apply_variant(scenario(), FleetVariant(remove_types=["F", "S"]))


def test_what_if_link_change_reaches_the_plan() -> None:
    slower = FleetVariant.model_validate({"inter_node": {"bandwidth_gb_per_s": 1}})
    base, row = fleet.what_if(scenario(), [slower], OPTIONS)
    # At 1 GB/s the sync takes 4 ms: both GPUs need at least 9 + 4 ms, F alone 12 ms wins.
    assert row.samples_per_s == pytest.approx(F_ALONE)
    assert row.samples_per_s_change == pytest.approx(F_ALONE / BOTH - 1)


@given(st.integers(1, 6), st.integers(1, 6), st.integers(1, 60))
def test_sub_fleets_are_distinct_subsets_with_the_whole_fleet_first(
        fast_nodes: int, slow_nodes: int, max_fleets: int) -> None:
    whole = scenario(fast_nodes, slow_nodes)
    fleets = fleet.sub_fleets(whole, max_fleets)
    names = [tuple(n.name for n in f.scenario.cluster.nodes) for f in fleets]
    assert names[0] == tuple(n.name for n in whole.cluster.nodes)
    assert len(set(names)) == len(names) <= max_fleets
    assert all(set(kept) <= set(names[0]) and kept for kept in names)


def test_a_fleet_the_search_refuses_is_an_outcome_and_the_frontier_goes_on() -> None:
    document = priced()
    document["gpu_types"]["S"]["memory_gib"] = 1  # below the job's 2 GiB reserve: nothing fits
    outcomes = fleet.plan_fleets(fleet.sub_fleets(planner.parse_scenario(document)), OPTIONS)
    refused = {o.label: o.error for o in outcomes if o.error is not None}
    assert list(refused) == ["S 1/1 nodes"] and "Infeasible" in refused["S 1/1 nodes"]
    assert [(p.samples_per_s, p.usd_per_hour) for p in fleet.frontier(outcomes)] == [
        (pytest.approx(F_ALONE), 4.0)]


def test_cost_objective_when_no_fleet_can_be_planned_names_the_first_refusal() -> None:
    document = priced()
    for gpu_type in ("F", "S"):
        document["gpu_types"][gpu_type]["memory_gib"] = 1  # below the 2 GiB reserve
    with pytest.raises(BudgetNotMet, match=r"none of the 3 fleets tried has a priced plan "
                       r"\(first, F 1/1 nodes, S 1/1 nodes: Infeasible"):
        fleet.plan_with_objective(planner.parse_scenario(document),
                                  objective(objective=Objective.COST))


def test_a_zero_floor_is_met_by_every_plan() -> None:
    result = fleet.plan_with_objective(scenario(), objective(objective=Objective.COST,
                                                             min_samples_per_s=0))
    assert result.evaluation.usd_per_hour == 1.0
