"""Plan quality: the per-type space searched whole, depth chosen through sync, pipelines
of three GPU types, and an upper bound no plan beats."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner import SearchOptions, evaluate, parse_plan, parse_scenario, plan
from planner.documents import Schedule
from planner.fleet import node_subsets
from planner.space_bound import _Knapsack, _Problem, _Rings, space_bound
from tests.planner.scenarios import tiny

DATA = Path(__file__).resolve().parent.parent / "data"


def _link_s(doc: dict[str, Any], gpu_type: str, size: float) -> float:
    link = doc["cluster"]["intra_node"][gpu_type]
    return link["latency_us"] * 1e-6 + size / (link["bandwidth_gb_per_s"] * 1e9)


def _least_bottleneck_splits(doc: dict[str, Any], gpu_type: str, b: int, tp: int,
                             depth: int) -> list[tuple[int, ...]]:
    """Every split of `depth` stages inside one node that fits with 1F1B's in-flight
    micro-batches and has the least bottleneck (stage compute plus blocking transfers,
    section 3), worked out split by split."""
    layers = doc["model"]["layers"]
    kinds = doc["model"]["kinds"]
    rows = {(r["kind"]): r for r in doc["profiles"]
            if r["gpu_type"] == gpu_type and r["micro_batch"] == b and r["tp"] == tp}
    capacity = (doc["gpu_types"][gpu_type]["memory_gib"] - doc["job"].get("reserved_gib", 2.0)) * 2**30
    per_param = 2 + doc["job"].get("grad_bytes", 4) + doc["job"].get("optimizer_bytes", 12)
    scored = []
    for cuts in itertools.combinations(range(1, len(layers)), depth - 1):
        bounds = (0, *cuts, len(layers))
        out = [kinds[layers[bounds[s + 1] - 1]]["output_bytes_per_sample"] * b
               for s in range(depth - 1)]
        worst, fits = 0.0, True
        for s in range(depth):
            held = layers[bounds[s]:bounds[s + 1]]
            around = (_link_s(doc, gpu_type, out[s - 1]) if s > 0 else 0.0) + (
                _link_s(doc, gpu_type, out[s]) if s < depth - 1 else 0.0)
            seconds = sum(rows[k]["forward_ms"] + rows[k]["backward_ms"] for k in held) * 1e-3
            worst = max(worst, seconds + 2 * around)
            state = sum(kinds[k]["params"] for k in held) / tp * per_param
            fits = fits and state + (depth - s) * sum(rows[k]["activation_bytes"] for k in held) \
                <= capacity
        if fits:
            scored.append((round(worst, 12), bounds))
    if not scored:
        return []
    least = min(w for w, _ in scored)
    return [bounds for w, bounds in scored if w == least]


def brute_force_per_type(doc: dict[str, Any]) -> float:
    """The best plan of homogeneous pipelines per node (one node per type here): any depth,
    profiled tp and micro-batch size, least-bottleneck split, any number of replicas, and
    every batch share; judged by the estimator."""
    scenario = parse_scenario(doc)
    batch = doc["job"]["global_batch_size"]
    per_node: list[list[list[dict[str, Any]]]] = []
    for node in doc["cluster"]["nodes"]:
        options: list[list[dict[str, Any]]] = [[]]  # the node may sit idle
        points = sorted({(r["micro_batch"], r["tp"]) for r in doc["profiles"]
                         if r["gpu_type"] == node["gpu_type"]})
        for b, tp in points:
            for depth in range(1, min(len(doc["model"]["layers"]), node["gpus"] // tp) + 1):
                for bounds in _least_bottleneck_splits(doc, node["gpu_type"], b, tp, depth):
                    for copies in range(1, node["gpus"] // (tp * depth) + 1):
                        pipelines = []
                        for c in range(copies):
                            first = c * depth * tp
                            pipelines.append({"micro_batch_size": b, "stages": [
                                {"gpu_type": node["gpu_type"], "tp": tp,
                                 "gpus": [f"{node['name']}:{first + s * tp + g}" for g in range(tp)],
                                 "layers": [bounds[s], bounds[s + 1]]} for s in range(depth)]})
                        options.append(pipelines)
        per_node.append(options)
    best = 0.0
    for combo in itertools.product(*per_node):
        pipelines = [p for group in combo for p in group]
        if not pipelines:
            continue
        sizes = [p["micro_batch_size"] for p in pipelines]
        for shares in itertools.product(range(1, batch + 1), repeat=len(pipelines)):
            if sum(b * m for b, m in zip(sizes, shares, strict=True)) != batch:
                continue
            document = {"format": "hetplan-plan/1", "pipelines": [
                dict(p, num_micro_batches=m) for p, m in zip(pipelines, shares, strict=True)]}
            result = evaluate(scenario, parse_plan(document))
            if result.valid and result.samples_per_s:
                best = max(best, result.samples_per_s)
    return best


@st.composite
def two_type_scenarios(draw: st.DrawFn) -> dict[str, Any]:
    """Two one-node GPU types, three layers, tp 1 or 2, b 1 or 2, a small batch."""
    doc = tiny()
    doc["model"]["layers"] = ["a", "b", "b"]
    doc["gpu_types"] = {"G": {"memory_gib": 10}, "S": {"memory_gib": draw(st.sampled_from([2.05, 10.0]))}}
    doc["cluster"]["nodes"] = [{"name": "g0", "gpu_type": "G", "gpus": draw(st.sampled_from([2, 3]))},
                               {"name": "s0", "gpu_type": "S", "gpus": 2}]
    doc["cluster"]["intra_node"]["S"] = {"bandwidth_gb_per_s": draw(st.sampled_from([5, 50])),
                                         "latency_us": 2}
    doc["cluster"]["inter_node"] = {"bandwidth_gb_per_s": draw(st.sampled_from([1, 10])),
                                    "latency_us": 0}
    slow = draw(st.sampled_from([1.5, 3.0]))
    rows = []
    for row in tiny()["profiles"]:
        for gpu_type, factor in (("G", 1.0), ("S", slow)):
            for b in (1, 2):
                for tp in (1, 2):
                    rows.append(dict(row, gpu_type=gpu_type, micro_batch=b, tp=tp,
                                     forward_ms=row["forward_ms"] * factor * b * (0.6 if tp == 2 else 1),
                                     backward_ms=row["backward_ms"] * factor * b * (0.6 if tp == 2 else 1),
                                     activation_bytes=row["activation_bytes"] * b // tp))
    doc["profiles"] = rows
    doc["job"]["global_batch_size"] = draw(st.sampled_from([4, 6]))
    return doc


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(two_type_scenarios())
def test_per_type_baseline_reaches_a_brute_force_over_the_per_type_space(doc: dict[str, Any]) -> None:
    expected = brute_force_per_type(doc)
    result = plan(parse_scenario(doc), SearchOptions(time_limit_s=2))
    found = result.baselines["per_type"]
    assert found is not None
    assert found >= expected * 0.995
    # And the search never returns less than any baseline.
    assert result.evaluation.samples_per_s is not None
    assert result.evaluation.samples_per_s >= max(v or 0 for v in result.baselines.values()) * (1 - 1e-9)


def deep_or_shallow() -> dict[str, Any]:
    """Eight GPUs on four 2-GPU nodes and eight equal layers with a big gradient over a
    slow network: shallow pipelines compute best (no transfers, no bubble), deeper ones
    sync less since each GPU holds fewer parameters."""
    return equal_layers_on_two_gpu_nodes(layers=8, nodes=4, params=400_000_000,
                                         output_bytes=1_000_000, batch=64)


def equal_layers_on_two_gpu_nodes(*, layers: int, nodes: int, params: int, output_bytes: int,
                                  batch: int) -> dict[str, Any]:
    """Equal layers of 10 + 20 ms per sample on 2-GPU nodes joined by 1 GB/s, 80 GiB each."""
    doc = tiny()
    doc["model"]["layers"] = ["b"] * layers
    doc["model"]["kinds"] = {"b": {"params": params, "output_bytes_per_sample": output_bytes}}
    doc["gpu_types"]["G"]["memory_gib"] = 80
    doc["cluster"]["nodes"] = [{"name": f"n{i}", "gpu_type": "G", "gpus": 2} for i in range(nodes)]
    doc["cluster"]["inter_node"] = {"bandwidth_gb_per_s": 1, "latency_us": 0}
    doc["profiles"] = [{"gpu_type": "G", "kind": "b", "micro_batch": 1, "tp": 1,
                        "forward_ms": 10, "backward_ms": 20, "activation_bytes": 1_000_000}]
    doc["job"] = {"global_batch_size": batch, "grad_bytes": 4, "reserved_gib": 0}
    return doc


def test_a_deeper_pipeline_is_chosen_when_only_its_sync_makes_it_faster() -> None:
    scenario = parse_scenario(deep_or_shallow())
    result = plan(scenario, SearchOptions(time_limit_s=5))
    chosen = result.plan.pipelines
    # Eight one-stage replicas would compute fastest; their ring moves every GPU's whole model.
    shallow = {"format": "hetplan-plan/1", "pipelines": [
        {"micro_batch_size": 1, "num_micro_batches": 8, "stages": [
            {"gpu_type": "G", "tp": 1, "gpus": [f"n{i // 2}:{i % 2}"], "layers": [0, 8]}]}
        for i in range(8)]}
    flat = evaluate(scenario, parse_plan(shallow))
    assert flat.valid and flat.iteration_s is not None and flat.sync_s is not None
    assert result.evaluation.iteration_s is not None
    assert result.evaluation.iteration_s < flat.iteration_s
    assert min(len(p.stages) for p in chosen) >= 2
    pipe_s = result.evaluation.iteration_s - (result.evaluation.sync_s or 0.0)
    assert pipe_s > flat.iteration_s - flat.sync_s  # slower pipelines: won on sync alone


def three_types() -> dict[str, Any]:
    """One GPU of each of three types, each with room for one layer only: the three-layer
    model runs only as a pipeline through all three types."""
    doc = tiny()
    doc["model"]["layers"] = ["b", "b", "b"]
    doc["model"]["kinds"] = {"b": {"params": 100_000_000, "output_bytes_per_sample": 1_000_000}}
    doc["gpu_types"] = {t: {"memory_gib": 4.0} for t in ("X", "Y", "Z")}
    doc["cluster"]["nodes"] = [{"name": t.lower(), "gpu_type": t, "gpus": 1} for t in ("X", "Y", "Z")]
    doc["cluster"]["intra_node"] = {t: {"bandwidth_gb_per_s": 100, "latency_us": 0} for t in "XYZ"}
    doc["profiles"] = [{"gpu_type": t, "kind": "b", "micro_batch": 1, "tp": 1, "forward_ms": f,
                        "backward_ms": 2 * f, "activation_bytes": 10_000_000}
                       for t, f in (("X", 1.0), ("Y", 2.0), ("Z", 3.0))]
    doc["job"] = {"global_batch_size": 8, "reserved_gib": 2.0}
    return doc


def test_a_pipeline_of_three_gpu_types_wins_where_nothing_else_fits() -> None:
    result = plan(parse_scenario(three_types()), SearchOptions(time_limit_s=5))
    (pipeline,) = result.plan.pipelines
    assert sorted(s.gpu_type for s in pipeline.stages) == ["X", "Y", "Z"]
    assert result.status.value == "optimal"
    assert result.baselines["per_type"] is None and result.baselines["homogeneous"] is None


@pytest.mark.parametrize("name", sorted(p.stem for p in (DATA / "scenarios").glob("*.json")))
def test_no_plan_beats_the_upper_bound(name: str) -> None:
    scenario = parse_scenario(json.loads((DATA / "scenarios" / f"{name}.json").read_text()))
    for path in (DATA / "reference").glob(f"{name}.*.plan.json"):
        plan_doc = parse_plan(json.loads(path.read_text()))
        bound = space_bound(scenario, {plan_doc.schedule or scenario.job.schedule})
        assert bound is not None
        judged = evaluate(scenario, plan_doc)
        if judged.valid and judged.samples_per_s is not None:
            assert judged.samples_per_s <= bound.samples_per_s


def test_the_upper_bound_counts_sync_when_rings_must_cross_slow_links() -> None:
    doc = deep_or_shallow()
    doc["cluster"]["nodes"] = [{"name": f"n{i}", "gpu_type": "G", "gpus": 1} for i in range(64)]
    doc["job"]["global_batch_size"] = 512
    scenario = parse_scenario(doc)
    bound = space_bound(scenario)
    assert bound is not None
    assert evaluate(scenario, parse_plan({"format": "hetplan-plan/1", "pipelines": [
        {"micro_batch_size": 1, "num_micro_batches": 512, "stages": [
            {"gpu_type": "G", "tp": 1, "gpus": ["n0:0"], "layers": [0, 8]}]}]})).samples_per_s \
        <= bound.samples_per_s
    # Compute alone allows 64 GPUs' worth; any ring between nodes costs at least its bytes.
    compute_only = 64 / (8 * 30e-3)
    assert bound.samples_per_s < compute_only * 0.999


def test_the_upper_bound_counts_transfers_of_pipelines_that_must_cross_nodes() -> None:
    # Two layers that fit on no single 1-GPU node, each sending 10 MB per sample over a
    # 1 GB/s link: every pipeline crosses once, 4 x 10 ms of blocking transfers per sample
    # beside 60 ms of compute, and rings move 100 MB of gradients per GPU.
    doc = tiny()
    doc["model"]["layers"] = ["b", "b"]
    doc["model"]["kinds"] = {"b": {"params": 25_000_000, "output_bytes_per_sample": 10_000_000}}
    doc["gpu_types"]["G"]["memory_gib"] = 1
    doc["cluster"]["nodes"] = [{"name": f"n{i}", "gpu_type": "G", "gpus": 1} for i in range(4)]
    doc["cluster"]["inter_node"] = {"bandwidth_gb_per_s": 1, "latency_us": 0}
    doc["profiles"] = [{"gpu_type": "G", "kind": "b", "micro_batch": 1, "tp": 1,
                        "forward_ms": 10, "backward_ms": 20, "activation_bytes": 200 * 2**20}]
    doc["job"] = {"global_batch_size": 8, "grad_bytes": 4, "reserved_gib": 0}
    scenario = parse_scenario(doc)
    optimum = plan(scenario, SearchOptions(exact=True))
    assert optimum.status.value == "optimal"
    assert all(len(p.stages) == 2 for p in optimum.plan.pipelines)
    bound = space_bound(scenario)
    assert bound is not None and optimum.evaluation.samples_per_s is not None
    assert optimum.evaluation.samples_per_s <= bound.samples_per_s
    compute_only = 4 / 60e-3  # every GPU computing all the time, nothing else
    assert bound.samples_per_s < 0.5 * compute_only


def test_the_upper_bound_counts_rings_that_must_leave_a_node_once_pipelines_fill_two() -> None:
    # Two 2-GPU nodes, a 1 GB/s link between them and 50 MB per sample between layers:
    # pipelines that cross nodes pay 200 ms of blocking transfers per sample beside 120 ms
    # of compute, and pipelines that stay inside nodes sync 200-800 MB of gradients across
    # them, unless they all sit on one node, which leaves the other idle.
    scenario = parse_scenario(equal_layers_on_two_gpu_nodes(
        layers=4, nodes=2, params=200_000_000, output_bytes=50_000_000, batch=8))
    optimum = plan(scenario, SearchOptions(exact=True))
    assert optimum.status.value == "optimal" and optimum.evaluation.samples_per_s is not None
    bound = space_bound(scenario)
    assert bound is not None
    assert optimum.evaluation.samples_per_s <= bound.samples_per_s
    # Taken apart, rings inside a node and pipelines inside a node would allow two
    # pipelines on both nodes at almost the compute bound; together they allow half of it.
    compute_only = 4 / 120e-3
    assert bound.samples_per_s < 0.55 * compute_only


@settings(max_examples=200, deadline=None)
@given(sync_s=st.floats(0.0, 3.0), low=st.integers(2, 4), smallest=st.integers(1, 8),
       nodes=st.integers(1, 3), pipeline_s=st.floats(0.001, 0.5),
       params=st.lists(st.integers(1, 400), min_size=2, max_size=4))
def test_the_rings_term_is_its_least_over_every_pipeline_time(
        sync_s: float, low: int, smallest: int, nodes: int, pipeline_s: float,
        params: list[int]) -> None:
    """The bound's rings term (pipeline time plus sync, rings inside nodes limited by the
    compute of the nodes holding them) is read at one point of a convex function: it must
    be that function's least over every pipeline time from the one given, never above it
    (a bound above the least would rule out plans that exist)."""
    doc = tiny()
    doc["model"]["layers"] = [f"k{i}" for i in range(len(params))]
    doc["model"]["kinds"] = {f"k{i}": {"params": m * 1_000_000, "output_bytes_per_sample": 0}
                             for i, m in enumerate(params)}
    doc["cluster"]["inter_node"] = {"bandwidth_gb_per_s": 1, "latency_us": 0}
    doc["profiles"] = [{"gpu_type": "G", "kind": f"k{i}", "micro_batch": 1, "tp": 1,
                        "forward_ms": 1 + i, "backward_ms": 2 + 3 * i, "activation_bytes": 0}
                       for i in range(len(params))]
    doc["job"] = {"global_batch_size": 16, "grad_bytes": 4, "reserved_gib": 0}
    problem = _Problem(parse_scenario(doc), {Schedule.ONE_F_ONE_B})
    rings = _Rings(problem, sync_s, low=low, smallest=smallest, nodes=nodes)
    least = rings.least_s(pipeline_s)
    assert least >= pipeline_s + sync_s - 1e-12
    inside_per_s = rings.inside_gpus / 16
    for step in range(2001):
        t = pipeline_s + step * 0.0005
        leaving = problem.total_params - problem.knapsack.params_within(inside_per_s * t)
        assert least <= t + max(sync_s, rings.per_param_s * leaving) + 1e-9


@given(layers=st.lists(st.tuples(st.integers(1, 50), st.floats(0.01, 5.0)), min_size=1,
                       max_size=6),
       budget=st.floats(0.0, 20.0))
def test_the_knapsack_holds_the_most_parameters_any_layers_within_a_compute_hold(
        layers: list[tuple[int, float]], budget: float) -> None:
    """The rings term trusts `params_within` to be the most parameters that layers of that
    much compute hold (a layer counted in part for part of its compute): no subset of whole
    layers within the budget holds more, the fractional optimum is reached, and
    `compute_holding` is its inverse."""
    params, least = [p for p, _ in layers], [c for _, c in layers]
    knapsack = _Knapsack.of(params, least)
    most = knapsack.params_within(budget)
    for chosen in itertools.product([0, 1], repeat=len(layers)):
        if sum(c for c, pick in zip(least, chosen, strict=True) if pick) <= budget:
            assert sum(p for p, pick in zip(params, chosen, strict=True) if pick) <= most + 1e-9
    # The fractional optimum: densest layers first, the last one in part.
    left, fractional = budget, 0.0
    for p, c in sorted(layers, key=lambda layer: -layer[0] / layer[1]):
        taken = min(1.0, left / c)
        fractional, left = fractional + taken * p, left - taken * c
        if left <= 0:
            break
    assert most == pytest.approx(fractional)
    if most < sum(params):
        assert knapsack.compute_holding(most) == pytest.approx(min(budget, sum(least)))


@pytest.mark.parametrize("launcher", ["megatron", "deepspeed", "torchtitan"])
def test_a_launcher_restricted_plan_is_one_the_launcher_runs(launcher: str) -> None:
    from planner.export import expressible, format_options, scenario_options

    scenario = parse_scenario(json.loads(
        (DATA / "scenarios" / "a40x32-t4x32-l4x16-gpt2.7b.json").read_text()))
    known = format_options(launcher)
    options = {k: v for k, v in scenario_options(scenario).items() if k in known}
    free = plan(scenario, SearchOptions(time_limit_s=5))
    restricted = plan(scenario, SearchOptions(time_limit_s=5, launcher=launcher))
    # The best plan mixes tp across its stages (T4 tp4 behind tp1 stages), which no
    # one-grid launcher runs: the restriction has something to restrict.
    assert expressible(free.plan, launcher, **options) is not None
    assert expressible(restricted.plan, launcher, **options) is None
    assert restricted.evaluation.valid
    assert restricted.evaluation.samples_per_s is not None and free.evaluation.samples_per_s
    assert restricted.evaluation.samples_per_s <= free.evaluation.samples_per_s * (1 + 1e-9)
    assert f"restricted to what {launcher} runs" in restricted.plan.search["origin"]


def test_an_unknown_launcher_is_refused_with_the_known_ones() -> None:
    scenario = parse_scenario(tiny())
    with pytest.raises(ValueError, match="unknown launcher 'slurmish'.*megatron"):
        plan(scenario, SearchOptions(launcher="slurmish"))


def deep_model_under_zero() -> dict[str, Any]:
    """96 GPUs of two types (H100, H200) and an 82-layer model about 70B parameters large
    (the LLaMA-13B scenario's blocks scaled), optimizer state sharded (ZeRO-1)."""
    doc = json.loads((DATA / "scenarios" / "h200x8-h100x16-a80x16-llama13b.json").read_text())
    doc["cluster"]["nodes"] = [{"name": f"{t[:4].lower()}-{i}", "gpu_type": t, "gpus": 8}
                               for t in ("H100-80G", "H200-141G") for i in range(6)]
    layers = doc["model"]["layers"]
    doc["model"]["layers"] = [layers[0], *["block"] * 80, layers[-1]]
    doc["model"]["kinds"]["block"]["params"] = int(doc["model"]["kinds"]["block"]["params"] * 2.7)
    for row in doc["profiles"]:
        if row["kind"] == "block":
            row.update(forward_ms=row["forward_ms"] * 2.7, backward_ms=row["backward_ms"] * 2.7,
                       activation_bytes=int(row["activation_bytes"] * 1.6))
    doc["job"].update(global_batch_size=1024, zero_stage=1)
    return doc


def test_per_type_plans_under_zero_stay_valid_for_their_own_pipeline_count() -> None:
    # Templates sized for state sharded over eight pipelines are valid only with eight or
    # more: a per-type plan of fewer must not use them.
    result = plan(parse_scenario(deep_model_under_zero()), SearchOptions(time_limit_s=5))
    assert result.baselines["per_type"] is not None
    assert result.evaluation.valid


def three_zones() -> dict[str, Any]:
    """The two-zone WAN scenario with a third zone: A100s and an H100 node in 'central',
    near 'east' and far from 'west'."""
    doc = json.loads((DATA / "scenarios" / "h100x16east-a80x32west-gpt6.7b-wan.json").read_text())
    doc["cluster"]["nodes"] += [
        {"name": f"a80c-{i}", "gpu_type": "A100-80G", "gpus": 8, "zone": "central"}
        for i in range(2)] + [
        {"name": "h100c-0", "gpu_type": "H100-80G", "gpus": 8, "zone": "central"}]
    doc["cluster"]["inter_zone"] = [
        {"zones": ["east", "west"], "bandwidth_gb_per_s": 1.25, "latency_us": 20000.0},
        {"zones": ["east", "central"], "bandwidth_gb_per_s": 3.0, "latency_us": 8000.0},
        {"zones": ["west", "central"], "bandwidth_gb_per_s": 0.6, "latency_us": 30000.0}]
    return doc


@pytest.mark.parametrize(("doc", "field"), [
    (three_zones(), "zone"),
    (json.loads((DATA / "scenarios" / "l40sx16-a40x8-v32x16-t4x8-gpt2.7b.json").read_text()),
     "gpu_type"),
], ids=["zones", "gpu-types"])
def test_the_whole_fleet_plans_at_least_as_fast_as_any_part_of_it(
        doc: dict[str, Any], field: str) -> None:
    """GPUs left idle when that is faster: a plan for the whole fleet is never slower than
    the search's plan for the nodes of some zones or GPU types only (rings across a slow
    inter-zone link, or a slow type's heavy stages, can cost more than those GPUs give)."""
    options = SearchOptions(time_limit_s=10)
    scenario = parse_scenario(doc)
    whole = plan(scenario, options).evaluation.samples_per_s
    assert whole is not None
    for kept, part in node_subsets(scenario, lambda node: getattr(node, field) or ""):
        if field == "gpu_type" and len(kept) < 3:
            continue  # all but one type is what a slow type left idle looks like
        alone = plan(part, options).evaluation.samples_per_s
        assert alone is not None
        assert whole >= alone * 0.999, kept
