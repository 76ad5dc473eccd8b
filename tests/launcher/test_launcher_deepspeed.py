"""The DeepSpeed export, checked by DeepSpeed itself: its config classes know every exported
key, and a plan with an uneven split trains one real `train_batch()` step under its
pipeline engine (4 CPU processes, gloo) exactly as one process does, also with every stage
recomputing (activation checkpointing)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
deepspeed = pytest.importorskip("deepspeed")

from deepspeed.runtime import constants as ds_constants  # noqa: E402
from deepspeed.runtime.config import get_pipeline_config  # noqa: E402
from deepspeed.runtime.zero.config import ZERO_OPTIMIZATION, DeepSpeedZeroConfig  # noqa: E402

from launcher.deepspeed_pipe import run_step  # noqa: E402
from launcher.reference import reference_weights  # noqa: E402
from planner import UnsupportedExport, parse_plan  # noqa: E402
from planner.export import export_plan  # noqa: E402
from profiles.distributed import spawn  # noqa: E402

TOLERANCE = 1e-6
LR = 0.1

# tiny-gpt on PP 2 x DP 2: stage 0 holds the embedding alone, stage 1 both blocks and the
# head (an uneven 1 | 3 split that partition_method cannot state).
UNEVEN = parse_plan({
    "format": "hetplan-plan/1",
    "schedule": "1f1b",
    "pipelines": [
        {"micro_batch_size": 2, "num_micro_batches": 2, "stages": [
            {"gpu_type": "cpu", "tp": 1, "gpus": [f"a:{2 * p}"], "layers": [0, 1]},
            {"gpu_type": "cpu", "tp": 1, "gpus": [f"a:{2 * p + 1}"], "layers": [1, 4]}]}
        for p in range(2)
    ],
})


RECOMPUTING = parse_plan(UNEVEN.model_dump(mode="json", exclude_none=True) | {"pipelines": [
    {**p, "stages": [{**s, "recompute": True} for s in p["stages"]]}
    for p in UNEVEN.model_dump(mode="json", exclude_none=True)["pipelines"]]})
PIPELINE = "pipeline"  # read by DeepSpeedConfig through get_pipeline_config, not a constant


def _top_level_keys() -> set[str]:
    """Every top-level key DeepSpeedConfig reads: the string constants it names them by."""
    names = {value for name, value in vars(ds_constants).items()
             if name.isupper() and isinstance(value, str)}
    return names | {ZERO_OPTIMIZATION, PIPELINE}


def _unknown_keys(ds_config: dict[str, Any]) -> list[str]:
    unknown = sorted(set(ds_config) - _top_level_keys())
    if ZERO_OPTIMIZATION in ds_config:
        DeepSpeedZeroConfig(**ds_config[ZERO_OPTIMIZATION])  # pydantic, extra="forbid"
    return unknown


@pytest.mark.parametrize("zero_stage", [0, 1])
def test_every_exported_ds_config_key_is_one_deepspeed_reads(zero_stage: int) -> None:
    ds_config = export_plan(UNEVEN, "deepspeed", zero_stage=zero_stage)["ds_config"]
    assert _unknown_keys(ds_config) == []
    assert ds_config.get("zero_allow_untested_optimizer", False) == (zero_stage > 0)


def test_recompute_asks_for_the_non_reentrant_checkpoint_of_one_group_per_stage() -> None:
    export = export_plan(RECOMPUTING, "deepspeed")
    assert _unknown_keys(export["ds_config"]) == []
    assert get_pipeline_config(export["ds_config"])["use_reentrant"] is False
    module = export["pipeline_module"]
    assert module["activation_checkpoint_interval"] == max(module["layer_counts"]) == 3
    assert export_plan(UNEVEN, "deepspeed")["pipeline_module"][
        "activation_checkpoint_interval"] == 0


def test_interleaving_local_and_partial_recompute_are_refused() -> None:
    document = RECOMPUTING.model_dump(mode="json", exclude_none=True)
    document["pipelines"][0]["stages"][0]["recompute"] = False
    with pytest.raises(UnsupportedExport, match="recompute on some stages only"):
        export_plan(parse_plan(document), "deepspeed")
    with pytest.raises(UnsupportedExport, match="no framework runs local learning"):
        export_plan(parse_plan(UNEVEN.model_dump(mode="json", exclude_none=True)
                               | {"schedule": "local"}), "deepspeed")
    interleaved = parse_plan({"schedule": "interleaved-1f1b", "pipelines": [
        {"micro_batch_size": 1, "num_micro_batches": 2, "stages": [
            {"gpu_type": "cpu", "tp": 1, "gpus": ["a:0"], "chunks": [[0, 1], [2, 3]]},
            {"gpu_type": "cpu", "tp": 1, "gpus": ["a:1"], "chunks": [[1, 2], [3, 4]]}]}]})
    with pytest.raises(UnsupportedExport, match="no interleaving"):
        export_plan(interleaved, "deepspeed")


def test_a_misspelt_ds_config_key_is_caught() -> None:
    assert _unknown_keys({"train_batch_sise": 8}) == ["train_batch_sise"]
    with pytest.raises(ValueError, match="stagee"):
        _unknown_keys({ZERO_OPTIMIZATION: {"stagee": 1}})


@pytest.mark.slow
@pytest.mark.parametrize(("zero_stage", "plan"), [(0, UNEVEN), (1, UNEVEN), (0, RECOMPUTING)],
                         ids=["zero0", "zero1", "zero0-recompute"])
def test_uneven_split_trains_like_one_process_under_deepspeed(zero_stage: int, plan: Any
                                                              ) -> None:
    export = export_plan(plan, "deepspeed", zero_stage=zero_stage)
    assert export["pipeline_module"]["partition_method"] is None
    bounds = export["pipeline_module"]["stage_bounds"]
    # The single-process run does not clip; DeepSpeed 0.19 clips at norm 1.0 unless told.
    export["ds_config"]["gradient_clipping"] = 0.0
    results = spawn(run_step, world_size=4, args=(export, "tiny-gpt", 0, LR))
    assert [r["bounds"] for r in results] == [
        (bounds[r["stage"]], bounds[r["stage"] + 1]) for r in results]
    assert sorted(r["stage"] for r in results) == [0, 0, 1, 1]
    batch = export["ds_config"]["train_batch_size"]
    expected, _ = reference_weights("tiny-gpt", batch, lr=LR)
    initial, _ = reference_weights("tiny-gpt", batch, lr=0.0)
    largest_difference = largest_step = 0.0
    for result in results:
        layers = {layer for layer, _ in result["weights"]}
        assert layers == set(range(*result["bounds"]))
        for (layer, name), tensor in result["weights"].items():
            want = expected[layer][name]
            largest_difference = max(largest_difference, (tensor - want).abs().max().item())
            largest_step = max(largest_step, (want - initial[layer][name]).abs().max().item())
    assert largest_difference < TOLERANCE
    assert largest_step > 1000 * TOLERANCE
