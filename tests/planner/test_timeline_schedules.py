"""The drawn timeline of the version 1.1 schedules (interleaved-1f1b, local, recompute):
it ends where the estimator's simulation does, runs every operation once, and matches
the hand-worked cases of test_estimate_schedules span for span."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.documents import Schedule
from planner.estimate import ChunkedStageEstimate, Evaluation, PipelineEstimate, simulate_estimate
from planner.timeline import Phase, Span, pipeline_timeline
from tests.planner.scenarios import deep, pipeline, plan, stage
from tests.planner.test_estimate_schedules import interleaved_two_by_two, run

MS = 1e-3
Op = tuple[str, int, int, float, float]
"""(F or B, the stage's chunk, micro-batch, start ms, end ms) of one whole operation."""


def operations(spans: list[Span], s: int) -> list[Op]:
    """Stage `s`'s operations, each put back together from its drawn parts: a backward
    is its recompute, head and backward spans; a transfer ends the operation before it."""
    ops: list[list[Any]] = []
    last: Phase | None = None
    for x in sorted((x for x in spans if x.stage == s), key=lambda x: x.start_s):
        continues = x.phase is Phase.TRANSFER or (
            x.phase in (Phase.HEAD, Phase.BACKWARD) and last in (Phase.RECOMPUTE, Phase.HEAD))
        if continues:
            assert abs(ops[-1][4] - x.start_s) < 1e-12, "an operation's parts are contiguous"
            ops[-1][4] = x.end_s
        else:
            kind = "F" if x.phase is Phase.FORWARD else "B"
            ops.append([kind, x.chunk, x.micro_batch, x.start_s, x.end_s])
        last = x.phase
    return [(k, j, i, round(a / MS, 9), round(b / MS, 9)) for k, j, i, a, b in ops]


def drawn_iteration_end(evaluation: Evaluation) -> float:
    """Where the viewer's timelines end: the slowest pipeline's last span, then the sync."""
    return max(max(x.end_s for x in pipeline_timeline(p)) for p in evaluation.pipelines) + \
        (evaluation.sync_s or 0.0)


def test_interleaved_two_stages_two_chunks_drawn_as_worked_by_hand() -> None:
    result = run(deep(4), interleaved_two_by_two())
    assert result.valid, result.errors
    spans = pipeline_timeline(result.pipelines[0])
    # The hand-worked order of test_estimate_schedules; model chunk c is chunk c // 2 of
    # stage c % 2 (c2 is stage 0's chunk 1).
    assert operations(spans, 0) == [
        ("F", 0, 0, 0.0, 1.1), ("F", 0, 1, 1.1, 2.2), ("F", 1, 0, 2.3, 3.5),
        ("F", 1, 1, 3.5, 4.7), ("B", 1, 0, 6.7, 8.9), ("B", 1, 1, 9.9, 12.1),
        ("B", 0, 0, 12.1, 14.2), ("B", 0, 1, 14.3, 16.4)]
    assert operations(spans, 1) == [
        ("F", 0, 0, 1.1, 2.3), ("F", 0, 1, 2.3, 3.5), ("F", 1, 0, 3.5, 4.6),
        ("B", 1, 0, 4.6, 6.7), ("F", 1, 1, 6.7, 7.8), ("B", 1, 1, 7.8, 9.9),
        ("B", 0, 0, 9.9, 12.1), ("B", 0, 1, 12.1, 14.3)]
    assert drawn_iteration_end(result) == pytest.approx(result.iteration_s, rel=1e-12)


def test_local_three_stages_drawn_with_the_head_before_each_backward() -> None:
    doc = deep(3, schedule="local", local_head_kind="h")
    doc["job"]["global_batch_size"] = 3
    result = run(doc, plan(pipeline([stage(["n0:0"], (0, 1)), stage(["n1:0"], (1, 2)),
                                     stage(["n0:1"], (2, 3))], m=3), schedule="local"))
    assert result.valid, result.errors
    spans = pipeline_timeline(result.pipelines[0])
    # Forward 1 ms + 0.1 ms per hop (blocking); backward: head 0.5 + 0.5 ms, layers 2 ms.
    assert operations(spans, 1) == [
        ("F", 0, 0, 1.1, 2.3), ("B", 0, 0, 2.3, 5.3), ("F", 0, 1, 5.3, 6.5),
        ("B", 0, 1, 6.5, 9.5), ("F", 0, 2, 9.5, 10.7), ("B", 0, 2, 10.7, 13.7)]
    first_backward = [(x.phase, round(x.start_s / MS, 9), round(x.end_s / MS, 9))
                      for x in spans if x.stage == 0 and x.micro_batch == 0][2:]
    assert first_backward == [(Phase.HEAD, 1.1, 2.1), (Phase.BACKWARD, 2.1, 4.1)]
    assert not any(x.phase is Phase.HEAD for x in spans if x.stage == 2)  # the last has none
    assert max(x.end_s for x in spans) == pytest.approx(13.8 * MS, rel=1e-12)
    assert drawn_iteration_end(result) == pytest.approx(result.iteration_s, rel=1e-12)


def test_a_recomputing_stage_draws_the_forward_again_before_each_backward() -> None:
    result = run(deep(4), interleaved_two_by_two(recompute=True))
    assert result.valid, result.errors
    spans = pipeline_timeline(result.pipelines[0])
    backward = [(x.phase, round((x.end_s - x.start_s) / MS, 9))
                for x in spans if x.stage == 0 and x.chunk == 1 and x.micro_batch == 0][2:]
    # Chunk [2, 3): 1 ms forward again, 2 ms backward, 0.1 ms each way to stage 1.
    assert backward == [(Phase.RECOMPUTE, 1.0), (Phase.BACKWARD, 2.0), (Phase.TRANSFER, 0.2)]
    assert not any(x.phase is Phase.RECOMPUTE for x in spans if x.stage == 1)
    assert drawn_iteration_end(result) == pytest.approx(result.iteration_s, rel=1e-12)


# -- every schedule, random shapes ---------------------------------------------------------

times_ms = st.floats(min_value=0.1, max_value=20.0)


def chunked_stage(draw: st.DrawFn, s: int, num_stages: int, num_chunks: int,
                  transfers: list[float], blocking: bool, schedule: Schedule
                  ) -> ChunkedStageEstimate:
    """A stage's estimate as the general path builds it: effective times are the parts
    plus the blocking transfers around each of its model chunks."""
    mine = range(s, num_stages * num_chunks, num_stages)
    recompute = draw(st.booleans())
    head_ms = draw(times_ms) if schedule is Schedule.LOCAL and s < num_stages - 1 else None
    forward, backward = [draw(times_ms) for _ in mine], [draw(times_ms) for _ in mine]
    effective_forward, effective_backward, out = [], [], []
    for j, c in enumerate(mine):
        around_ms = ((transfers[c - 1] if c > 0 else 0.0)
                     + (transfers[c] if c < len(transfers) else 0.0)) * 1e3 * blocking
        effective_forward.append(forward[j] + around_ms)
        effective_backward.append((head_ms or 0.0) + forward[j] * recompute + backward[j]
                                  + (0.0 if schedule is Schedule.LOCAL else around_ms))
        out.append(transfers[c] if c < len(transfers) else None)
    return ChunkedStageEstimate(
        gpu_type="g", tp=1, gpus=["n:0"], layers=None, forward_ms=sum(forward),
        backward_ms=sum(backward), effective_forward_ms=sum(effective_forward),
        effective_backward_ms=sum(effective_backward), transfer_to_next_s=None, sync_s=0.0,
        in_flight=1, state_bytes=0.0, activation_bytes=0.0, memory_bytes=0.0, memory_gib=0.0,
        reserved_gib=0.0, capacity_gib=1.0, fits=True, activation_peak_bytes=0.0,
        recompute=recompute, chunks=[[c, c + 1] for c in mine], chunk_forward_ms=forward,
        chunk_backward_ms=backward, chunk_effective_forward_ms=effective_forward,
        chunk_effective_backward_ms=effective_backward, chunk_transfer_to_next_s=out,
        chunk_activation_bytes=[0.0 for _ in mine],
        head_forward_ms=None if head_ms is None else head_ms / 2,
        head_backward_ms=None if head_ms is None else head_ms / 2)


@st.composite
def general_pipelines(draw: st.DrawFn) -> PipelineEstimate:
    schedule = draw(st.sampled_from(list(Schedule)))
    num_stages = draw(st.integers(1, 5))
    num_chunks = draw(st.integers(1, 3)) if schedule is Schedule.INTERLEAVED_1F1B else 1
    m = num_stages * draw(st.integers(1, 3)) if num_chunks > 1 else draw(st.integers(1, 8))
    blocking = draw(st.booleans())
    transfers = [draw(st.floats(0.0, 0.01)) for _ in range(num_stages * num_chunks - 1)]
    stages = [chunked_stage(draw, s, num_stages, num_chunks, transfers, blocking, schedule)
              for s in range(num_stages)]
    return PipelineEstimate(
        index=0, micro_batch_size=1, num_micro_batches=m, samples=m, num_stages=num_stages,
        T_p=0.0, blocking_transfers=blocking, stages=list(stages), schedule=schedule.value,
        num_chunks=num_chunks)


@settings(max_examples=150, deadline=None)
@given(general_pipelines())
def test_every_schedule_ends_when_the_estimators_simulation_does(
        estimate: PipelineEstimate) -> None:
    expected = simulate_estimate(estimate, estimate.num_micro_batches)
    end = max(x.end_s for x in pipeline_timeline(estimate))
    assert abs(end - expected) <= 1e-12 * max(1.0, expected)


@settings(max_examples=80, deadline=None)
@given(general_pipelines())
def test_every_schedule_runs_each_operation_once_one_at_a_time(
        estimate: PipelineEstimate) -> None:
    spans = pipeline_timeline(estimate)
    m, v = estimate.num_micro_batches, estimate.num_chunks
    for s in range(estimate.num_stages):
        own = sorted((x for x in spans if x.stage == s), key=lambda x: x.start_s)
        assert all(a.end_s <= b.start_s + 1e-12 for a, b in zip(own, own[1:], strict=False))
        computed = sorted((x.phase, x.chunk, x.micro_batch) for x in own
                          if x.phase in (Phase.FORWARD, Phase.BACKWARD))
        assert computed == sorted((phase, j, i) for phase in (Phase.FORWARD, Phase.BACKWARD)
                                  for j in range(v) for i in range(m))
