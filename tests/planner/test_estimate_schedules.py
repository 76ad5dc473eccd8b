"""Hand-worked cases of the version 1.1 schedules (docs/formats.md) (interleaved 1F1B, local learning,
recomputation) and one test per validity rule it adds."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from planner import InvalidPlan, InvalidScenario, estimate, evaluate, parse_plan, parse_scenario
from planner.estimate import Evaluation
from tests.planner.scenarios import chunked, deep, pipeline, plan, stage

MS = 1e-3
STATE = 2 + 4 + 12  # bytes per parameter: the job defaults


def run(scenario: dict[str, Any], plan_doc: dict[str, Any]) -> Evaluation:
    return evaluate(parse_scenario(scenario), parse_plan(plan_doc))


def interleaved_two_by_two(recompute: bool = False) -> dict[str, Any]:
    """Two stages on two nodes, two one-layer chunks each: model chunks 0, 1, 2, 3 sit on
    stages 0, 1, 0, 1; every hop (1 -> 2 included) crosses nodes: X = 1e6 B / 10 GB/s."""
    return plan(pipeline([chunked(["n0:0"], [(0, 1), (2, 3)], recompute=recompute),
                          chunked(["n1:0"], [(1, 2), (3, 4)])], m=2),
                schedule="interleaved-1f1b")


def test_interleaved_two_stages_two_chunks_two_micro_batches_worked_by_hand() -> None:
    result = run(deep(4), interleaved_two_by_two())
    assert result.valid, result.errors
    first, second = result.pipelines[0].stages
    # Blocking: chunk c costs 1 ms (2 ms backward) + X_(c-1) + X_c, X = 0.1 ms.
    assert first.chunk_effective_forward_ms == pytest.approx([1.1, 1.2])
    assert second.chunk_effective_backward_ms == pytest.approx([2.2, 2.1])
    assert first.chunk_transfer_to_next_s == pytest.approx([1e-4, 1e-4])
    assert second.chunk_transfer_to_next_s[1] is None  # model chunk 3 is the last
    # Stage 0: F(c0,0) 0-1.1, F(c0,1) -2.2, F(c2,0) 2.3-3.5, F(c2,1) -4.7, B(c2,0) 6.7-8.9,
    #   B(c2,1) 9.9-12.1, B(c0,0) 12.1-14.2, B(c0,1) 14.3-16.4.
    # Stage 1: F(c1,0) 1.1-2.3, F(c1,1) -3.5, F(c3,0) -4.6, B(c3,0) -6.7, F(c3,1) -7.8,
    #   B(c3,1) -9.9, B(c1,0) -12.1, B(c1,1) 12.1-14.3.
    assert result.pipelines[0].T_p == pytest.approx(16.4 * MS)
    # Stage 0 warms up with all four forwards; stage 1 holds three at most.
    assert (first.in_flight, second.in_flight) == (4, 3)
    assert (first.activation_bytes, second.activation_bytes) == (4 * 2e6, 3 * 2e6)
    assert first.layers is None and first.chunks == [[0, 1], [2, 3]]
    assert first.state_bytes == 2 * 1e6 * STATE
    # The same layers as plain 1F1B over two two-layer stages take 18.6 ms.
    plain = run(deep(4), plan(pipeline([stage(["n0:0"], (0, 2)), stage(["n1:0"], (2, 4))])))
    assert plain.pipelines[0].T_p == pytest.approx(18.6 * MS)


def test_interleaved_one_chunk_per_stage_is_1f1b() -> None:
    one_chunk = plan(pipeline([chunked(["n0:0"], [(0, 2)]), chunked(["n1:0"], [(2, 4)])], m=3),
                     schedule="interleaved-1f1b")
    as_1f1b = plan(pipeline([stage(["n0:0"], (0, 2)), stage(["n1:0"], (2, 4))], m=3))
    doc = deep(4)
    doc["job"]["global_batch_size"] = 3
    ours, theirs = run(doc, one_chunk), run(doc, as_1f1b)
    assert ours.valid, ours.errors
    assert ours.iteration_s == theirs.iteration_s
    assert [s.memory_bytes for s in ours.pipelines[0].stages] == \
        [s.memory_bytes for s in theirs.pipelines[0].stages]


def test_local_three_stages_three_micro_batches_worked_by_hand() -> None:
    doc = deep(3, schedule="local", local_head_kind="h")
    doc["job"]["global_batch_size"] = 3
    result = run(doc, plan(pipeline([stage(["n0:0"], (0, 1)), stage(["n1:0"], (1, 2)),
                                     stage(["n0:1"], (2, 3))], m=3), schedule="local"))
    assert result.valid, result.errors
    s0, s1, s2 = result.pipelines[0].stages
    # Forwards carry their blocking transfers (0.1 ms per hop); backwards carry none but
    # the head's 0.5 + 0.5 ms on every stage but the last.
    assert [s.effective_forward_ms for s in (s0, s1, s2)] == pytest.approx([1.1, 1.2, 1.1])
    assert [s.effective_backward_ms for s in (s0, s1, s2)] == pytest.approx([3.0, 3.0, 2.0])
    # Each stage runs F0 B0 F1 B1 F2 B2; only forwards wait on the previous stage:
    # s0 ends at 12.3, s1 F2 waits for s0 F2 (9.3) and ends at 13.7, s2 at 13.8.
    assert result.pipelines[0].T_p == pytest.approx(13.8 * MS)
    # One micro-batch in flight; the head's activations and state on stages 0 and 1.
    assert [s.in_flight for s in (s0, s1, s2)] == [1, 1, 1]
    assert [s.activation_bytes for s in (s0, s1, s2)] == [2.5e6, 2.5e6, 2e6]
    assert s0.state_bytes == (1e6 + 1000) * STATE
    assert s2.state_bytes == 1e6 * STATE
    assert s0.head_kind == "h" and s2.head_kind is None
    assert any("not end-to-end backpropagation" in w for w in result.warnings)


def test_local_heads_join_the_gradient_sync_as_one_more_layer() -> None:
    doc = deep(3, schedule="local", local_head_kind="h")
    result = run(doc, plan(pipeline([stage(["n0:0"], (0, 2)), stage(["n0:1"], (2, 3))], m=1),
                           pipeline([stage(["n1:0"], (0, 2)), stage(["n1:1"], (2, 3))], m=1),
                           schedule="local"))
    assert result.valid, result.errors
    # Rings of two across nodes at 10 GB/s: 2 (n - 1) / n * params * 4 bytes / 1e10 per layer.
    layer_s, head_s = 1e6 * 4 / 1e10, 1000 * 4 / 1e10
    assert result.pipelines[0].stages[0].sync_s == pytest.approx(2 * layer_s + head_s)
    assert result.pipelines[0].stages[1].sync_s == pytest.approx(layer_s)


def test_recompute_keeps_inputs_and_one_layer_and_runs_the_forward_again() -> None:
    doc = deep(4)
    doc["job"]["global_batch_size"] = 4
    stages = [stage(["n0:0"], (0, 1)), dict(stage(["n1:0"], (1, 3)), recompute=True),
              stage(["n0:1"], (3, 4))]
    result = run(doc, plan(pipeline(stages, m=4)))
    assert result.valid, result.errors
    middle = result.pipelines[0].stages[1]
    # min(S - s, m) = 2 inputs of 1e6 bytes (layer 0's output), plus one layer's 2e6.
    assert middle.in_flight == 2
    assert middle.activation_peak_bytes == 2 * 1e6
    assert middle.recompute_input_bytes == [1e6]
    assert middle.recompute_max_activation_bytes == 2e6
    assert middle.activation_bytes == 2 * 1e6 + 2e6  # 8e6 without recomputation
    # Backward: the two layers' forward again (2 ms), their backward (4 ms), both transfers.
    assert middle.effective_backward_ms == pytest.approx(2 + 4 + 0.1 + 0.1)
    assert middle.effective_forward_ms == pytest.approx(2 + 0.1 + 0.1)


def test_recompute_on_an_interleaved_stage_keeps_each_chunks_input() -> None:
    result = run(deep(4), interleaved_two_by_two(recompute=True))
    first = result.pipelines[0].stages[0]
    # Chunk [0, 1) keeps nothing (the input is the data); chunk [2, 3) keeps layer 1's
    # output. Four forwards held at once: 0 + 0 + 1e6 + 1e6, plus one layer's 2e6.
    assert first.recompute_input_bytes == [0.0, 1e6]
    assert first.activation_peak_bytes == 2e6
    assert first.activation_bytes == 4e6
    assert first.chunk_effective_backward_ms == pytest.approx([1 + 2 + 0.1, 1 + 2 + 0.2])


def test_price_of_the_gpus_a_plan_uses() -> None:
    doc = deep(4)
    doc["gpu_types"]["G"]["hourly_usd"] = 1.5
    result = run(doc, interleaved_two_by_two())
    assert result.usd_per_hour == 3.0  # two GPUs used, six left idle
    assert result.tokens_per_s is not None and result.iteration_s is not None
    assert result.usd_per_million_tokens == pytest.approx(3.0 / 3600 / result.tokens_per_s * 1e6)
    assert result.usd_per_iteration == pytest.approx(3.0 / 3600 * result.iteration_s)


def test_price_is_absent_when_a_used_type_has_none() -> None:
    result = run(deep(4), interleaved_two_by_two())
    assert result.valid
    assert (result.usd_per_hour, result.usd_per_million_tokens, result.usd_per_iteration) == \
        (None, None, None)


# -- validity rules --------------------------------------------------------------------------

def errors_of(scenario: dict[str, Any], plan_doc: dict[str, Any]) -> list[str]:
    result = run(scenario, plan_doc)
    assert not result.valid
    return result.errors


def test_stages_with_different_chunk_counts_are_rejected() -> None:
    doc = plan(pipeline([chunked(["n0:0"], [(0, 1), (2, 4)]), chunked(["n1:0"], [(1, 2)])]),
               schedule="interleaved-1f1b")
    assert any(e.startswith("pipelines[0].stages[1]: holds 1 chunk(s) but stages[0] holds 2")
               for e in errors_of(deep(4), doc))


def test_chunks_out_of_model_order_are_rejected() -> None:
    doc = plan(pipeline([chunked(["n0:0"], [(0, 1), (1, 2)]), chunked(["n1:0"], [(2, 3), (3, 4)])]),
               schedule="interleaved-1f1b")
    errors = errors_of(deep(4), doc)
    assert any(e.startswith("pipelines[0].stages[1].chunks[0]: [2, 3) is model chunk 1 and does "
                            "not continue the model at layer 1") for e in errors)


def test_chunks_that_stop_short_of_the_last_layer_are_rejected() -> None:
    doc = plan(pipeline([chunked(["n0:0"], [(0, 1), (2, 3)]), chunked(["n1:0"], [(1, 2), (3, 4)])]),
               schedule="interleaved-1f1b")
    assert "pipelines[0]: model chunks end at layer 4, not at 5; they must cover every layer" in \
        errors_of(deep(5), doc)


def test_interleaved_micro_batches_not_a_multiple_of_the_stages_are_rejected() -> None:
    doc = plan(pipeline([chunked(["n0:0"], [(0, 1), (2, 3)]), chunked(["n1:0"], [(1, 2), (3, 4)])],
                        m=3), schedule="interleaved-1f1b")
    scenario = deep(4)
    scenario["job"]["global_batch_size"] = 3
    assert any(e.startswith("pipelines[0]: num_micro_batches is 3, not a multiple of its 2 stages")
               for e in errors_of(scenario, doc))


def test_chunks_under_1f1b_are_rejected() -> None:
    doc = plan(pipeline([chunked(["n0:0"], [(0, 1), (2, 3)]), chunked(["n1:0"], [(1, 2), (3, 4)])]))
    assert any(e.startswith("pipelines[0].stages[0]: holds 2 chunks but the plan's schedule is "
                            "'1f1b'") for e in errors_of(deep(4), doc))


def test_local_plan_for_a_job_that_is_not_local_is_rejected() -> None:
    doc = plan(pipeline([stage(["n0:0"], (0, 2)), stage(["n1:0"], (2, 4))]), schedule="local")
    assert any(e.startswith("schedule: the plan runs 'local' but job.schedule is '1f1b'")
               for e in errors_of(deep(4, local_head_kind="h"), doc))


def test_local_pipelines_with_different_blocks_are_rejected() -> None:
    doc = plan(pipeline([stage(["n0:0"], (0, 2)), stage(["n0:1"], (2, 4))], m=1),
               pipeline([stage(["n1:0"], (0, 1)), stage(["n1:1"], (1, 4))], m=1), schedule="local")
    errors = errors_of(deep(4, schedule="local", local_head_kind="h"), doc)
    assert any(e.startswith("pipelines[1]: stage layers [[[0, 1]], [[1, 4]]] differ from "
                            "pipelines[0]'s [[[0, 2]], [[2, 4]]]") for e in errors)


def test_local_stage_without_a_head_profile_row_is_rejected() -> None:
    scenario = deep(4, schedule="local", local_head_kind="h")
    scenario["profiles"] = [row for row in scenario["profiles"] if row["kind"] != "h"]
    doc = plan(pipeline([stage(["n0:0"], (0, 2)), stage(["n1:0"], (2, 4))]), schedule="local")
    errors = errors_of(scenario, doc)
    assert any(e.startswith("pipelines[0].stages[0]: no profile row for the local head "
                            "(G, h, micro_batch 1, tp 1)") for e in errors)
    assert not any(e.startswith("pipelines[0].stages[1]") for e in errors)  # the last has none


def test_local_job_without_a_head_kind_is_rejected() -> None:
    with pytest.raises(InvalidScenario, match="job.local_head_kind"):
        parse_scenario(deep(4, schedule="local"))


def test_head_kind_the_model_does_not_declare_is_rejected() -> None:
    with pytest.raises(InvalidScenario, match="job.local_head_kind: unknown layer kind"):
        parse_scenario(deep(4, schedule="local", local_head_kind="nope"))


def test_head_kind_that_is_also_a_layer_is_rejected() -> None:
    with pytest.raises(InvalidScenario, match="also a layer of model.layers"):
        parse_scenario(deep(4, schedule="local", local_head_kind="b"))


def test_stage_with_both_layers_and_chunks_is_rejected() -> None:
    both = dict(stage(["n0:0"], (0, 4)), chunks=[[0, 4]])
    with pytest.raises(InvalidPlan, match=r"pipelines\[0\].stages\[0\].*either `layers`"):
        parse_plan(plan(pipeline([both])))


def test_reading_one_range_of_a_chunked_stage_is_refused() -> None:
    parsed = parse_plan(interleaved_two_by_two())
    with pytest.raises(InvalidPlan, match="several layer chunks"):
        _ = parsed.pipelines[0].stages[0].layers
    assert parsed.pipelines[0].stages[0].ranges == [(0, 1), (2, 3)]


def test_version_1_plan_serialises_without_the_new_fields() -> None:
    from planner.documents import dump_document

    doc = plan(pipeline([stage(["n0:0"], (0, 2)), stage(["n1:0"], (2, 4))]))
    assert dump_document(parse_plan(doc)) == doc
    recomputing = plan(pipeline([dict(stage(["n0:0"], (0, 4)), recompute=True)]))
    assert dump_document(parse_plan(recomputing)) == recomputing


REFERENCE = Path(__file__).parent.parent / "data" / "reference"
VERSION_1_VECTORS = sorted(p for p in REFERENCE.glob("*.random*.plan.json")
                           if ".interleaved." not in p.name and ".local." not in p.name)


@pytest.mark.parametrize("plan_path", VERSION_1_VECTORS, ids=lambda p: p.name)
def test_general_path_gives_the_plain_paths_numbers_on_version_1_plans(
    plan_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    variant = plan_path.name.removesuffix(".plan.json").rsplit(".", 1)[0]  # NAME.VARIANT
    scenario = parse_scenario(json.loads((REFERENCE / f"{variant}.json").read_text()))
    parsed = parse_plan(json.loads(plan_path.read_text()))
    plain = evaluate(scenario, parsed)
    monkeypatch.setattr(estimate, "_is_version_1", lambda plan, schedule: False)
    monkeypatch.setattr(estimate, "_needs_general_path", lambda pipeline, schedule: True)
    general = evaluate(scenario, parsed)
    assert isinstance(general.pipelines[0].stages[0], estimate.ChunkedStageEstimate)
    assert general.iteration_s == plain.iteration_s
    for ours, theirs in zip(general.pipelines, plain.pipelines, strict=True):
        assert ours.T_p == theirs.T_p
        for our_stage, their_stage in zip(ours.stages, theirs.stages, strict=True):
            for f in dataclasses.fields(estimate.StageEstimate):
                mine, plain_value = getattr(our_stage, f.name), getattr(their_stage, f.name)
                if isinstance(plain_value, float):  # sums may associate differently
                    assert mine == pytest.approx(plain_value, rel=1e-12), f.name
                else:
                    assert mine == plain_value, f.name
