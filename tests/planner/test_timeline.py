"""The drawn timeline replays the estimator's event simulation: same finish, one
operation at a time per stage, every dependency respected."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from planner.documents import Schedule
from planner.estimate import PipelineEstimate, StageEstimate
from planner.simulate import simulate_pipeline
from planner.timeline import Phase, pipeline_timeline

times_ms = st.floats(min_value=0.1, max_value=50.0)


def stage(forward_ms: float, backward_ms: float, transfer_s: float | None,
          transfer_in_s: float, blocking: bool) -> StageEstimate:
    extra_ms = ((transfer_s or 0.0) + transfer_in_s) * 1e3 if blocking else 0.0
    return StageEstimate(
        gpu_type="g", tp=1, gpus=["n:0"], layers=[0, 1], forward_ms=forward_ms,
        backward_ms=backward_ms, effective_forward_ms=forward_ms + extra_ms,
        effective_backward_ms=backward_ms + extra_ms, transfer_to_next_s=transfer_s, sync_s=0.0,
        in_flight=1, state_bytes=0.0, activation_bytes=0.0, activation_peak_bytes=0.0,
        memory_bytes=0.0, memory_gib=0.0, reserved_gib=0.0, capacity_gib=1.0, fits=True)


@st.composite
def pipelines(draw: st.DrawFn) -> PipelineEstimate:
    num_stages = draw(st.integers(1, 6))
    blocking = draw(st.booleans())
    transfers = [draw(st.floats(0.0, 0.02)) for _ in range(num_stages - 1)]
    stages = [stage(draw(times_ms), draw(times_ms),
                    transfers[s] if s < num_stages - 1 else None,
                    transfers[s - 1] if s > 0 else 0.0, blocking) for s in range(num_stages)]
    return PipelineEstimate(
        index=0, micro_batch_size=1, num_micro_batches=draw(st.integers(1, 12)), samples=1,
        num_stages=num_stages, T_p=0.0, blocking_transfers=blocking, stages=stages,
        schedule=draw(st.sampled_from([Schedule.ONE_F_ONE_B, Schedule.GPIPE])).value)


@settings(max_examples=150, deadline=None)
@given(pipelines())
def test_the_timeline_ends_when_the_simulation_does(pipeline: PipelineEstimate) -> None:
    spans = pipeline_timeline(pipeline)
    expected = simulate_pipeline(
        [s.effective_forward_ms * 1e-3 for s in pipeline.stages],
        [s.effective_backward_ms * 1e-3 for s in pipeline.stages],
        [s.transfer_to_next_s or 0.0 for s in pipeline.stages[:-1]],
        pipeline.num_micro_batches, Schedule(pipeline.schedule),
        blocking_transfers=pipeline.blocking_transfers)
    assert abs(max(s.end_s for s in spans) - expected) <= 1e-12 * max(1.0, expected)


@settings(max_examples=80, deadline=None)
@given(pipelines())
def test_a_stage_runs_one_span_at_a_time_and_every_operation_once(
        pipeline: PipelineEstimate) -> None:
    spans = pipeline_timeline(pipeline)
    for s in range(pipeline.num_stages):
        own = sorted((x for x in spans if x.stage == s), key=lambda x: x.start_s)
        assert all(a.end_s <= b.start_s + 1e-12 for a, b in zip(own, own[1:], strict=False))
        computed = [(x.phase, x.micro_batch) for x in own if x.phase is not Phase.TRANSFER]
        m = pipeline.num_micro_batches
        assert sorted(computed) == sorted([(Phase.FORWARD, i) for i in range(m)]
                                          + [(Phase.BACKWARD, i) for i in range(m)])


def test_two_stages_one_micro_batch_by_hand() -> None:
    # F0 = 1 ms, F1 = 2 ms, B1 = 4 ms, B0 = 3 ms, transfers of 0.5 ms that block:
    # stage 0 forward 1 + 0.5, stage 1 forward 0.5 + 2, backward 4 + 0.5, stage 0 back 0.5 + 3.
    first = stage(1.0, 3.0, 0.0005, 0.0, True)
    second = stage(2.0, 4.0, None, 0.0005, True)
    pipeline = PipelineEstimate(index=0, micro_batch_size=1, num_micro_batches=1, samples=1,
                                num_stages=2, T_p=0.0, blocking_transfers=True,
                                stages=[first, second])
    ends = {(x.stage, x.phase, x.micro_batch): round(x.end_s * 1e3, 9)
            for x in pipeline_timeline(pipeline)}
    assert ends[0, Phase.FORWARD, 0] == 1.0
    assert ends[1, Phase.FORWARD, 0] == 1.5 + 2.0
    assert ends[1, Phase.BACKWARD, 0] == 4.0 + 4.0
    assert ends[0, Phase.TRANSFER, 0] == 8.5 + 3.5
