"""The torch layer zoo: shapes, parameter counts, deterministic init, TP equivalence."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from profiles.models import PRESETS, ModelSpec, layer_params  # noqa: E402
from profiles.torch_layers import build_layer, layer_kinds, shard_tensor  # noqa: E402
from profiles.tp_check import compare_tensor_parallel, run_model_step  # noqa: E402

TINY = ["tiny-gpt", "tiny-llama"]


@pytest.mark.parametrize("name", TINY)
def test_layer_shapes_and_loss(name: str) -> None:
    spec = PRESETS[name]
    kinds = layer_kinds(spec)
    assert kinds == ["embedding", "block", "block", "head"]
    layers = [build_layer(spec, k, layer_index=i) for i, k in enumerate(kinds)]
    ids = torch.randint(0, spec.vocab_size, (3, spec.seq_len))
    hidden = layers[0](ids)
    assert hidden.shape == (3, spec.seq_len, spec.hidden)
    for block in layers[1:-1]:
        hidden = block(hidden)
        assert hidden.shape == (3, spec.seq_len, spec.hidden)
    loss = layers[-1](hidden, ids)
    assert loss.shape == ()
    # Freshly initialised logits are near uniform: loss close to ln(vocab).
    assert abs(loss.item() - torch.log(torch.tensor(float(spec.vocab_size))).item()) < 0.5


@pytest.mark.parametrize("name", TINY)
def test_module_parameter_counts_match_the_pure_formula(name: str) -> None:
    spec = PRESETS[name]
    for i, kind in enumerate(layer_kinds(spec)):
        module = build_layer(spec, kind, layer_index=i)
        assert sum(p.numel() for p in module.parameters()) == layer_params(spec, kind)


def test_init_is_deterministic_per_seed_and_layer() -> None:
    spec = PRESETS["tiny-gpt"]
    a = build_layer(spec, "block", layer_index=1).state_dict()
    b = build_layer(spec, "block", layer_index=1).state_dict()
    other_layer = build_layer(spec, "block", layer_index=2).state_dict()
    other_seed = build_layer(spec, "block", layer_index=1, seed=7).state_dict()
    key = "attn.qkv_weight"
    assert torch.equal(a[key], b[key])
    assert not torch.equal(a[key], other_layer[key])
    assert not torch.equal(a[key], other_seed[key])


def test_dtype_cast_keeps_the_same_values() -> None:
    spec = PRESETS["tiny-llama"]
    full = build_layer(spec, "block", layer_index=1, dtype=torch.float64)
    single = build_layer(spec, "block", layer_index=1)
    for (name, p64), p32 in zip(full.named_parameters(), single.parameters(), strict=True):
        assert torch.equal(p64.float(), p32), name


def test_shard_tensor_splits_qkv_per_projection() -> None:
    full = torch.arange(12.0).reshape(6, 2)  # q = rows 0-1, k = rows 2-3, v = rows 4-5
    shard = shard_tensor("attn.qkv_weight", full, tp_rank=1, tp_size=2)
    assert shard.tolist() == [[2.0, 3.0], [6.0, 7.0], [10.0, 11.0]]
    assert torch.equal(shard_tensor("attn_norm.weight", full, tp_rank=1, tp_size=2), full)
    assert shard_tensor("mlp.down_weight", full.T, tp_rank=0, tp_size=2).shape == (2, 3)


def test_tp_degree_that_does_not_divide_heads_is_rejected() -> None:
    spec = ModelSpec(name="odd", style="gpt", vocab_size=16, hidden=12, num_heads=3,
                     ffn_hidden=24, num_blocks=1, seq_len=4)
    with pytest.raises(ValueError, match="num_heads \\(3\\) is not divisible by tp=2"):
        build_layer(spec, "block", layer_index=1, tp_size=2)


def test_tp_without_process_group_is_rejected() -> None:
    with pytest.raises(ValueError, match="init_process_group"):
        build_layer(PRESETS["tiny-gpt"], "block", layer_index=1, tp_rank=0, tp_size=2)


def test_layer_index_must_match_kind() -> None:
    with pytest.raises(ValueError, match="is a 'block', not 'head'"):
        build_layer(PRESETS["tiny-gpt"], "head", layer_index=1)


def test_a_local_head_is_a_head_with_weights_of_its_own() -> None:
    spec = PRESETS["tiny-gpt"]
    local = build_layer(spec, "local_head", layer_index=1)
    head = build_layer(spec, "head", layer_index=3)
    assert sum(p.numel() for p in local.parameters()) == layer_params(spec, "local_head") \
        == layer_params(spec, "head")
    # Seeded apart from every layer and from the heads of other blocks.
    assert not torch.equal(local.weight, head.weight)
    assert not torch.equal(local.weight, build_layer(spec, "local_head", layer_index=2).weight)
    assert torch.equal(local.weight, build_layer(spec, "local_head", layer_index=1).weight)
    hidden = torch.randn(2, spec.seq_len, spec.hidden)
    labels = torch.randint(0, spec.vocab_size, (2, spec.seq_len))
    assert local(hidden, labels).shape == ()


def test_a_local_head_reads_a_layer_before_the_models_head() -> None:
    with pytest.raises(ValueError, match="layers before its head are 0..2"):
        build_layer(PRESETS["tiny-gpt"], "local_head", layer_index=3)


def test_the_comparison_sees_a_different_model() -> None:
    # Guards the TP test below against comparing something with itself.
    spec = PRESETS["tiny-gpt"]
    a = run_model_step(spec, micro_batch=1, dtype=torch.float64)
    b = run_model_step(spec, micro_batch=1, seed=1, dtype=torch.float64)
    assert (a.outputs[-1] - b.outputs[-1]).abs().item() > 1e-6


@pytest.mark.parametrize("name", TINY)
def test_tp2_under_gloo_equals_tp1_on_outputs_and_gradients(name: str) -> None:
    result = compare_tensor_parallel(PRESETS[name], tp_size=2, micro_batch=2,
                                     dtype=torch.float64)
    # Bitwise-identical initial shards; float64 sums in a different order only.
    assert result.max_param_diff == 0.0
    assert result.max_output_diff < 1e-12
    assert result.max_input_grad_diff < 1e-12
    assert result.max_grad_diff < 1e-12


def test_tp_size_that_differs_from_the_group_is_rejected(tmp_path: Path) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0,
                            world_size=1)
    try:
        with pytest.raises(ValueError, match="the TP process group has 1 ranks"):
            build_layer(PRESETS["tiny-gpt"], "block", layer_index=1, tp_rank=0, tp_size=2)
    finally:
        dist.destroy_process_group()
