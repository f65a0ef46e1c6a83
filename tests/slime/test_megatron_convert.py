"""HF <-> megatron-core conversion on tiny real HF models: exact round trips, the fused layouts by hand,
and config mapping. The last test builds a real megatron-core GPTModel and skips when megatron-core
is not installed (it is in the GPU sets only)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3ForCausalLM

from slime.backends.megatron_convert import (
    fuse_qkv,
    gpt_model_kwargs,
    hf_to_megatron,
    iter_megatron_to_hf,
    megatron_to_hf,
    padded_vocab_size,
    split_qkv,
    transformer_config_kwargs,
)
from slime.models.tiny import build_config


def qwen3(tied: bool = True) -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    return Qwen3ForCausalLM(build_config(300, eos_id=299, pad_id=0, tie_word_embeddings=tied))


def llama() -> LlamaForCausalLM:
    torch.manual_seed(1)
    return LlamaForCausalLM(LlamaConfig(vocab_size=200, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                                        num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=False))


def test_fused_qkv_layout_is_grouped_by_kv_head():
    d, h, heads, groups = 2, 3, 4, 2  # two query heads per group
    q = torch.arange(heads * d * h, dtype=torch.float32).reshape(heads * d, h)
    k = 100 + torch.arange(groups * d * h, dtype=torch.float32).reshape(groups * d, h)
    v = 200 + torch.arange(groups * d * h, dtype=torch.float32).reshape(groups * d, h)
    fused = fuse_qkv(q, k, v, heads, groups)
    expected = torch.cat([q[0:4], k[0:2], v[0:2], q[4:8], k[2:4], v[2:4]])  # [q0 q1 k0 v0 | q2 q3 k1 v1]
    assert torch.equal(fused, expected)
    back = split_qkv(fused, heads, groups)
    assert all(torch.equal(a, b) for a, b in zip(back, (q, k, v), strict=True))
    bias = fuse_qkv(q[:, 0], k[:, 0], v[:, 0], heads, groups)  # 1-D biases use the same grouping
    assert torch.equal(bias, expected[:, 0])


@pytest.mark.parametrize("fused_norms", [False, True])
@pytest.mark.parametrize("make", [lambda: qwen3(True), lambda: qwen3(False), llama], ids=["qwen3-tied", "qwen3", "llama"])
def test_round_trip_is_exact(make, fused_norms):
    model = make()
    config = model.config
    hf = model.state_dict()
    mg = hf_to_megatron(hf, config, fused_norms=fused_norms)

    rows = padded_vocab_size(config.vocab_size)
    assert mg["embedding.word_embeddings.weight"].shape == (rows, config.hidden_size)
    assert torch.count_nonzero(mg["embedding.word_embeddings.weight"][config.vocab_size:]) == 0
    assert ("output_layer.weight" in mg) == (not config.tie_word_embeddings)
    norm = "self_attention.linear_qkv.layer_norm_weight" if fused_norms else "input_layernorm.weight"
    assert f"decoder.layers.1.{norm}" in mg
    assert ("decoder.layers.0.self_attention.q_layernorm.weight" in mg) == (config.model_type == "qwen3")
    heads, groups, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    assert mg["decoder.layers.0.self_attention.linear_qkv.weight"].shape == ((heads + 2 * groups) * d, config.hidden_size)
    assert torch.equal(mg["decoder.layers.0.mlp.linear_fc1.weight"][: config.intermediate_size],
                       hf["model.layers.0.mlp.gate_proj.weight"])

    back = megatron_to_hf(mg, config)
    expected = {k: v for k, v in hf.items() if not (config.tie_word_embeddings and k == "lm_head.weight")}
    assert back.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(back[key], value), key
    fresh = type(model)(config)
    fresh.load_state_dict(back, strict=not config.tie_word_embeddings)
    x = torch.tensor([[1, 5, 9, 3]])
    assert torch.equal(fresh(x).logits, model(x).logits)


def test_unknown_weights_are_refused():
    with pytest.raises(ValueError, match="no Megatron name"):
        hf_to_megatron({"model.layers.0.mystery.weight": torch.zeros(1)}, qwen3().config)
    with pytest.raises(ValueError, match="no HF name"):
        megatron_to_hf({"decoder.layers.0.mystery": torch.zeros(1)}, qwen3().config)


def test_config_mapping():
    config = qwen3(tied=True).config
    kwargs = transformer_config_kwargs(config)
    assert kwargs["num_layers"] == config.num_hidden_layers and kwargs["hidden_size"] == config.hidden_size
    assert kwargs["ffn_hidden_size"] == config.intermediate_size
    assert (kwargs["num_attention_heads"], kwargs["num_query_groups"], kwargs["kv_channels"]) == (
        config.num_attention_heads, config.num_key_value_heads, config.head_dim)
    assert kwargs["qk_layernorm"] and kwargs["gated_linear_unit"] and kwargs["normalization"] == "RMSNorm"
    assert kwargs["activation_func"] is torch.nn.functional.silu and not kwargs["add_qkv_bias"]
    model = gpt_model_kwargs(config, tp=2)
    assert model["vocab_size"] == 512 and model["share_embeddings_and_output_weights"]
    assert model["rotary_base"] > 0 and model["max_sequence_length"] == config.max_position_embeddings
    assert not transformer_config_kwargs(llama().config)["qk_layernorm"]
    assert padded_vocab_size(151_669) == 151_680 and padded_vocab_size(256, 128, 2) == 256
    with pytest.raises(ValueError, match="model_type"):
        transformer_config_kwargs({"model_type": "gpt2"})


def test_a_real_megatron_gpt_model_takes_the_weights_and_computes_the_same_logits(monkeypatch):
    """megatron-core on CPU (platform-facts section 5: gloo world of 1 and two shims). Skipped unless
    megatron-core is importable (e.g. PYTHONPATH=<pip --target dir>)."""
    pytest.importorskip("megatron.core", reason="megatron-core is in the GPU sets only")
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel import random as mg_random
    from megatron.core.transformer import TransformerConfig

    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    monkeypatch.setattr(mg_random.CudaRNGStatesTracker, "fork", lambda self, *a, **k: __import__("contextlib").nullcontext())
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    try:
        hf = qwen3(tied=False)
        config = TransformerConfig(
            **transformer_config_kwargs(hf.config), use_cpu_initialization=True, params_dtype=torch.float32,
            gradient_accumulation_fusion=False, bias_dropout_fusion=False, apply_rope_fusion=False,
            masked_softmax_fusion=False, persist_layer_norm=False)
        model = GPTModel(config, get_gpt_layer_local_spec(qk_layernorm=True), **gpt_model_kwargs(hf.config)).eval()
        expected = {k: v.shape for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
        converted = hf_to_megatron(hf.state_dict(), hf.config)
        assert {k: v.shape for k, v in converted.items()} == expected
        model.load_state_dict(converted, strict=False)
        # Same function, not just same shapes: Megatron's logits equal HF's (padding columns aside).
        x = torch.tensor([[1, 5, 9, 3, 77, 12]])
        causal = torch.triu(torch.ones(6, 6), diagonal=1).bool()[None, None]  # True = masked out
        with torch.no_grad():
            logits = model(input_ids=x, position_ids=torch.arange(6)[None], attention_mask=causal)
            expected_logits = hf.eval()(x).logits
        torch.testing.assert_close(logits[..., : hf.config.vocab_size], expected_logits, atol=1e-5, rtol=0)
        back = megatron_to_hf(model.state_dict(), hf.config)
        assert all(torch.equal(back[k], v) for k, v in hf.state_dict().items())
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def test_streamed_conversion_matches_the_whole_state_conversion():
    """`iter_megatron_to_hf` (what a tensor weight sync streams) gives `megatron_to_hf`'s names and tensors."""
    model = qwen3(tied=False)
    config, hf = model.config, model.state_dict()
    megatron = hf_to_megatron(hf, config)

    streamed = list(iter_megatron_to_hf(megatron, config))

    assert [name for name, _ in streamed] == list(megatron_to_hf(megatron, config))
    assert sorted(name for name, _ in streamed) == sorted(hf)
    for name, tensor in streamed:
        assert torch.equal(tensor, hf[name]), name
