"""Hand-worked cases of docs/formats.md's time and memory model."""

from __future__ import annotations

import math

import pytest

from planner import evaluate, parse_plan, parse_scenario
from tests.planner.scenarios import pipeline, plan, stage, tiny, uniform

MS = 1e-3
GIB = 2**30


def run(scenario: dict, plan_doc: dict):  # type: ignore[no-untyped-def]
    return evaluate(parse_scenario(scenario), parse_plan(plan_doc))


def test_one_stage_pipeline_runs_micro_batches_back_to_back() -> None:
    result = run(tiny(), plan(pipeline([stage(["n0:0"], (0, 2))], m=2)))
    assert result.valid, result.errors
    # (1 + 2) ms forward, (2 + 4) ms backward, twice.
    assert result.iteration_s == pytest.approx(2 * 9 * MS)
    assert result.sync_s == 0.0
    assert result.samples_per_s == pytest.approx(2 / (18 * MS))
    assert result.tokens_per_s == pytest.approx(8 * 2 / (18 * MS))


def test_two_equal_stages_with_blocking_transfers() -> None:
    # Stages on different nodes: X = 1e6 B / 10 GB/s = 0.1 ms, charged to both stages.
    result = run(uniform(), plan(pipeline([stage(["n0:0"], (0, 1)), stage(["n1:0"], (1, 2))])))
    assert result.valid, result.errors
    assert result.pipelines[0].stages[0].effective_forward_ms == pytest.approx(1.1)
    # Worked timeline: s0 F F, s1 F B F B, s0 B waits for s1 B each time.
    assert result.pipelines[0].T_p == pytest.approx(9.6 * MS)


def test_two_stages_one_micro_batch_pay_every_transfer_twice() -> None:
    doc = uniform()
    doc["job"]["global_batch_size"] = 1
    result = run(doc, plan(pipeline([stage(["n0:0"], (0, 1)), stage(["n1:0"], (1, 2))], m=1)))
    assert result.iteration_s == pytest.approx((1 + 0.1 + 1 + 0.1 + 2 + 0.1 + 2 + 0.1) * MS)


def test_two_equal_stages_with_non_blocking_transfers() -> None:
    result = run(uniform(blocking_transfers=False),
                 plan(pipeline([stage(["n0:0"], (0, 1)), stage(["n1:0"], (1, 2))])))
    assert result.valid, result.errors
    assert result.pipelines[0].T_p == pytest.approx(9.2 * MS)


def test_unequal_stages_1f1b_and_gpipe() -> None:
    two = [stage(["n0:0"], (0, 1)), stage(["n0:1"], (1, 2))]  # layer a hands over 0 bytes
    one_f_one_b = run(tiny(), plan(pipeline(two)))
    gpipe = run(tiny(), plan(pipeline(two), schedule="gpipe"))
    assert one_f_one_b.pipelines[0].T_p == pytest.approx(15 * MS)
    assert gpipe.pipelines[0].T_p == pytest.approx(15 * MS)
    # 1F1B keeps min(S - s, m) micro-batches, GPipe keeps all m.
    assert [s.in_flight for s in one_f_one_b.pipelines[0].stages] == [2, 1]
    assert [s.in_flight for s in gpipe.pipelines[0].stages] == [2, 2]
    assert gpipe.pipelines[0].stages[1].activation_bytes == 2 * 2_000_000
    assert one_f_one_b.pipelines[0].stages[1].activation_bytes == 2_000_000


def test_memory_breakdown_and_per_type_reserved_memory() -> None:
    doc = tiny()
    doc["gpu_types"]["G"]["reserved_gib"] = 1.0
    result = run(doc, plan(pipeline([stage(["n0:0"], (0, 2))])))
    st = result.pipelines[0].stages[0]
    # 2e6 params * (2 + 4 + 12) bytes, 2 micro-batches? no: one stage keeps min(1, 2) = 1.
    assert st.state_bytes == 2e6 * 18
    assert st.activation_bytes == 3_000_000
    assert st.memory_bytes == 2e6 * 18 + 3_000_000 + 1.0 * GIB
    assert st.reserved_gib == 1.0


def test_sync_of_two_pipelines_across_nodes() -> None:
    doc = tiny()
    result = run(doc, plan(pipeline([stage(["n0:0"], (0, 2))], m=1),
                           pipeline([stage(["n1:0"], (0, 2))], m=1)))
    # Per layer 2 (n-1)/n * 1e6 params * 4 B / 10 GB/s = 0.4 ms; two layers.
    assert result.sync_s == pytest.approx(0.8 * MS)
    assert result.iteration_s == pytest.approx(9 * MS + 0.8 * MS)


def test_sync_of_three_pipelines_with_a_shared_interface() -> None:
    doc = tiny()
    doc["job"]["global_batch_size"] = 3
    doc["cluster"]["nodes"][0]["nics"] = 1
    result = run(doc, plan(pipeline([stage(["n0:0"], (0, 2))], m=1),
                           pipeline([stage(["n0:1"], (0, 2))], m=1),
                           pipeline([stage(["n1:0"], (0, 2))], m=1)))
    # n0 uses 2 GPUs on 1 NIC: its inter-node hops get 5 GB/s; the n0-n0 hop is intra-node.
    per_layer = 2 * 2 / 3 * 1e6 * 4 / 5e9
    assert result.sync_s == pytest.approx(2 * per_layer)
    assert result.shared_nics == {"n0": {"nics": 1, "used_gpus": 2, "share": 0.5}}
    without = tiny()
    without["job"]["global_batch_size"] = 3
    plain = run(without, plan(pipeline([stage(["n0:0"], (0, 2))], m=1),
                              pipeline([stage(["n0:1"], (0, 2))], m=1),
                              pipeline([stage(["n1:0"], (0, 2))], m=1)))
    assert plain.sync_s == pytest.approx(2 * 2 * 2 / 3 * 1e6 * 4 / 10e9)


def test_zero1_shards_optimizer_state_over_pipelines() -> None:
    result = run(tiny(zero_stage=1), plan(pipeline([stage(["n0:0"], (0, 2))], m=1),
                                          pipeline([stage(["n1:0"], (0, 2))], m=1)))
    assert result.pipelines[0].stages[0].state_bytes == 2e6 * (2 + 4 + 12 / 2)


def test_compute_bound_and_efficiency() -> None:
    result = run(tiny(), plan(pipeline([stage(["n0:0"], (0, 2))])))
    # c = 9 ms per sample per GPU; 8 GPUs; batch 2.
    assert result.compute_bound_iteration_s == pytest.approx(2 / (8 / 9e-3))
    assert result.efficiency == pytest.approx(result.compute_bound_iteration_s / result.iteration_s)


@pytest.mark.parametrize(
    ("plan_doc", "fragment"),
    [
        (plan(pipeline([stage(["n0:0"], (0, 2))]), pipeline([stage(["n0:0"], (0, 2))], m=0)),
         "already used"),
        (plan(pipeline([stage(["n0:0", "n1:0"], (0, 2), tp=2)], m=2)), "one node"),
        (plan(pipeline([stage(["n0:0"], (0, 2), tp=2)], m=2)), "exactly tp"),
        (plan(pipeline([stage(["n0:0"], (0, 1))], m=2)), "cover every layer"),
        (plan(pipeline([stage(["n0:0"], (0, 1)), stage(["n0:1"], (0, 2))], m=2)), "continue"),
        (plan(pipeline([stage(["n0:0"], (0, 2))], m=3)), "global batch"),
        (plan(pipeline([stage(["n0:0"], (0, 2))], b=2, m=1)), "no profile row"),
        (plan(pipeline([stage(["n9:0"], (0, 2))], m=2)), "names no GPU"),
        (plan(pipeline([stage(["n0:7"], (0, 2))], m=2)), "names no GPU"),
    ],
    ids=["gpu_used_twice", "stage_spans_nodes", "tp_mismatch", "layers_not_covered",
         "layers_not_contiguous", "batch_mismatch", "missing_profile", "unknown_node",
         "index_out_of_range"],
)
def test_invalid_plan_is_reported(plan_doc: dict, fragment: str) -> None:
    result = run(tiny(), plan_doc)
    assert not result.valid
    assert any(fragment in e for e in result.errors), result.errors


def test_every_violation_is_reported_not_just_the_first() -> None:
    bad = plan(pipeline([stage(["n0:0"], (0, 1))], m=3), pipeline([stage(["n0:0"], (0, 2))]))
    result = run(tiny(), bad)
    assert len(result.errors) >= 3


def test_plan_that_does_not_fit_in_memory_is_invalid_with_numbers() -> None:
    doc = tiny()
    doc["gpu_types"]["G"]["memory_gib"] = 2.0  # the reserved 2 GiB leaves nothing
    result = run(doc, plan(pipeline([stage(["n0:0"], (0, 2))])))
    assert not result.valid
    assert any("GiB" in e and "needs" in e for e in result.errors)
    assert not math.isnan(result.iteration_s or math.nan)


def test_compute_bound_belongs_to_its_own_scenario() -> None:
    """The bound is remembered per scenario document: a new document, even one that takes
    a collected one's place in memory, gets its own."""
    from planner.bounds import compute_bound_s

    rates = []
    for batch in (2, 4, 8):
        doc = tiny()
        doc["job"]["global_batch_size"] = batch
        scenario = parse_scenario(doc)
        assert compute_bound_s(scenario) == compute_bound_s(scenario)
        rates.append(compute_bound_s(scenario))
        del scenario
    assert rates == pytest.approx([2 / (8 / 9e-3), 4 / (8 / 9e-3), 8 / (8 / 9e-3)])


def test_what_the_estimator_derives_from_a_scenario_is_built_once_per_scenario() -> None:
    from planner.costs import node_index, profile_index

    scenario, twin = parse_scenario(tiny()), parse_scenario(tiny())
    assert node_index(scenario) is node_index(scenario)
    assert profile_index(scenario) is profile_index(scenario)
    assert node_index(twin) is not node_index(scenario)  # equal documents, kept apart
    nodes = node_index(scenario)
    assert nodes.locate("n1:3") == (nodes.by_name["n1"], 3)
    for name in ("n1:4", "n9:0", "n1", "n1:x"):  # names of no GPU: answered, never kept
        assert nodes.locate(name) is None
    assert set(nodes._located) == {"n1:3"}


@pytest.mark.parametrize("memory_factor", [1.0, 0.5, 0.25])
def test_the_memory_screen_says_what_the_estimator_finds(memory_factor: float) -> None:
    """`overflows_memory` over every pipeline of every reference plan, its GPUs' memory
    shrunk until stages overflow: true exactly where the estimator finds a stage that does
    not fit (the plans of every schedule, chunks and recomputation included)."""
    import json

    from planner.estimate import overflows_memory
    from tests.planner.test_reference_vectors import CASES

    overflowing = 0
    for scenario_path, plan_path, _ in CASES:
        doc = json.loads(scenario_path.read_text())
        for gpu_type in doc["gpu_types"].values():
            gpu_type["memory_gib"] *= memory_factor
        scenario = parse_scenario(doc)
        plan_doc = parse_plan(json.loads(plan_path.read_text()))
        evaluation = evaluate(scenario, plan_doc)
        for i, estimate in enumerate(evaluation.pipelines):
            full = not all(s.fits for s in estimate.stages)
            assert overflows_memory(scenario, plan_doc, [i]) == full, (plan_path.name, i)
            overflowing += full
    assert (overflowing > 0) == (memory_factor < 1.0)
