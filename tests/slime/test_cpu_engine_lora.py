"""The CPU engine serves LoRA adapters as SGLang does: /load_lora_adapter, /generate with `lora_path`,
/unload_lora_adapter, over a real engine on 127.0.0.1 and the tiny Qwen3.

The reference is peft itself: each adapter is made by peft (`get_peft_model` + `save_pretrained`, so the
folder is peft's own format) and the engine's log-probs with it must equal those of
`PeftModel.from_pretrained` over the same base. Base and adapter requests share a batch and must each
get their own model; a folder the engine cannot serve is a 400 with a sentence, and the engine serves on.
The prefix cache serves each weights' own KV: a multi-turn adapter conversation re-uses its turns' KV (and
still equals peft), a reloaded adapter never gets its previous load's, base and adapter never each other's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from slime.engine.base import EngineClient, EngineError
from slime.engine.cpu_server import CPUEngine
from slime.engine.lora_adapters import load_adapter_body, unload_adapter_body
from slime.models.tiny import build_tiny_model

peft = pytest.importorskip("peft", reason="peft (the reference for LoRA log-probs) is not installed")

PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [21, 22, 23, 24]]
TOL = 2e-5


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("lora") / "tiny", seed=0)


def make_adapter(model_dir: Path, folder: Path, *, seed: int, r: int = 4, alpha: float = 8.0,
                 targets: list[str] | None = None, **config: Any) -> Path:
    """A peft LoRA folder (peft's own save_pretrained) with random, non-zero A and B."""
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    lora = peft.LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0,
                           target_modules=targets or ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                      "up_proj", "down_proj"], **config)
    model = peft.get_peft_model(base, lora)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def adapters(model_dir, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {
        "all": make_adapter(model_dir, root / "all", seed=1),
        "attn-rslora": make_adapter(model_dir, root / "attn", seed=2, r=2, alpha=3.0, targets=["q_proj", "v_proj"],
                                    use_rslora=True),
        "mlp": make_adapter(model_dir, root / "mlp", seed=3, r=8, alpha=16.0, targets=["down_proj"]),
    }


def reference(model_dir: Path, adapter: Path | None, ids: list[int]) -> torch.Tensor:
    """log_softmax of the next-token logits at every position, from peft over the base (or the base)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if adapter is not None:
        model = peft.PeftModel.from_pretrained(model, adapter)
    with torch.no_grad():
        return torch.log_softmax(model.eval()(torch.tensor([ids])).logits[0].float(), dim=-1)


def post(engine, path: str, body: Any) -> httpx.Response:
    return httpx.post(f"{engine.url}{path}", json=body, timeout=120)


def load(engine, name: str, folder: Path | str) -> httpx.Response:
    return post(engine, "/load_lora_adapter", load_adapter_body(name, folder))


def unload(engine, name: str) -> httpx.Response:
    return post(engine, "/unload_lora_adapter", unload_adapter_body(name))


def sampled(prompt: list[int], seed: int, **extra: Any) -> dict[str, Any]:
    return {"input_ids": prompt, "return_logprob": True, "logprob_start_len": 0,
            "sampling_params": {"max_new_tokens": 6, "temperature": 1.0, "sampling_seed": seed, "ignore_eos": True},
            **extra}


def assert_matches(model_dir: Path, adapter: Path | None, prompt: list[int], result: dict[str, Any]) -> None:
    """The engine's output and prompt log-probs equal the reference model's for the same tokens."""
    meta = result["meta_info"]
    output = [tok for _, tok, _ in meta["output_token_logprobs"]]
    ref = reference(model_dir, adapter, prompt + output)
    want_out = [ref[len(prompt) - 1 + i, tok].item() for i, tok in enumerate(output)]
    got_out = [lp for lp, _, _ in meta["output_token_logprobs"]]
    want_in = [ref[i - 1, prompt[i]].item() for i in range(1, len(prompt))]
    got_in = [lp for lp, _, _ in meta["input_token_logprobs"]]
    assert got_in[0] is None
    assert got_out == pytest.approx(want_out, abs=TOL)
    assert got_in[1:] == pytest.approx(want_in, abs=TOL)


def test_adapter_log_probs_equal_peft(engine, model_dir, adapters):
    reply = load(engine, "all", adapters["all"])
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"success": True, "error_message": None, "loaded_adapters": {"all": str(adapters["all"])}}

    result = post(engine, "/generate", sampled(PROMPTS[0], 11, lora_path="all")).json()

    assert_matches(model_dir, adapters["all"], PROMPTS[0], result)
    # the adapter matters: the base model's log-probs of the same tokens differ clearly
    tokens = PROMPTS[0] + [tok for _, tok, _ in result["meta_info"]["output_token_logprobs"]]
    base, tuned = reference(model_dir, None, tokens), reference(model_dir, adapters["all"], tokens)
    assert (base - tuned).abs().max() > 0.05
    assert unload(engine, "all").status_code == 200


def test_base_and_adapter_requests_share_a_batch(engine, model_dir, adapters):
    for name in ("attn-rslora", "mlp"):
        assert load(engine, name, adapters[name]).status_code == 200
    names = ["attn-rslora", None, "mlp"]
    body = {"input_ids": PROMPTS, "return_logprob": True, "logprob_start_len": 0, "lora_path": names,
            "sampling_params": [{"max_new_tokens": 6, "temperature": 1.0, "sampling_seed": s, "ignore_eos": True}
                                for s in (1, 2, 3)]}

    results = post(engine, "/generate", body).json()
    # a decode batch mixing them, with no prompt scoring (the scored prefill runs each prompt alone)
    body = {**body, "return_logprob": True, "logprob_start_len": -1}
    batched = post(engine, "/generate", body).json()

    for prompt, name, result, again in zip(PROMPTS, names, results, batched, strict=True):
        assert_matches(model_dir, adapters[name] if name else None, prompt, result)
        assert again["output_ids"] == result["output_ids"]
        assert [lp for lp, _, _ in again["meta_info"]["output_token_logprobs"]] == pytest.approx(
            [lp for lp, _, _ in result["meta_info"]["output_token_logprobs"]], abs=TOL)
    for name in ("attn-rslora", "mlp"):
        assert unload(engine, name).status_code == 200


def turn(engine, prompt: list[int], seed: int, adapter: str | None = None) -> dict[str, Any]:
    """One turn of a conversation: output log-probs only (a scored prompt is never served from the prefix cache)."""
    body = {"input_ids": prompt, "return_logprob": True, "lora_path": adapter,
            "sampling_params": {"max_new_tokens": 6, "temperature": 1.0, "sampling_seed": seed, "ignore_eos": True}}
    reply = post(engine, "/generate", body)
    assert reply.status_code == 200, reply.text
    return reply.json()


def assert_outputs_match(model_dir: Path, adapter: Path | None, prompt: list[int], result: dict[str, Any]) -> None:
    """The engine's output log-probs equal the reference model's (peft over the base, or the base)."""
    output = result["output_ids"]
    ref = reference(model_dir, adapter, prompt + output)
    want = [ref[len(prompt) - 1 + i, tok].item() for i, tok in enumerate(output)]
    assert [lp for lp, _, _ in result["meta_info"]["output_token_logprobs"]] == pytest.approx(want, abs=TOL)


def reused(prompt: list[int], result: dict[str, Any]) -> int:
    """Cached tokens a next turn extending `prompt` + this result should get: all but the last output token,
    which was sampled but never fed to the model."""
    return len(prompt) + len(result["output_ids"]) - 1


@pytest.fixture
def fresh(engine) -> Iterator[None]:
    """No adapter loaded and an empty prefix cache, before and after: what another test (maybe a failed
    one) left must not decide this one's loads or hits, nor this one's the next."""
    def clear() -> None:
        for name in engine.batcher.lora.loaded():
            assert unload(engine, name).status_code == 200
        assert post(engine, "/flush_cache", {}).status_code == 200

    clear()
    yield
    clear()


def test_a_multi_turn_adapter_conversation_prefills_only_its_new_tokens(engine, fresh, model_dir, adapters):
    assert load(engine, "all", adapters["all"]).status_code == 200
    first_prompt = list(range(100, 120))  # the prefix cache keeps matches of 16 tokens and more
    first = turn(engine, first_prompt, 1, "all")
    second_prompt = first_prompt + first["output_ids"] + [130, 131, 132]  # + the next observation

    second = turn(engine, second_prompt, 2, "all")

    assert first["meta_info"]["cached_tokens"] == 0
    assert second["meta_info"]["cached_tokens"] == reused(first_prompt, first)
    assert_outputs_match(model_dir, adapters["all"], first_prompt, first)
    assert_outputs_match(model_dir, adapters["all"], second_prompt, second)  # the cached KV is the adapter's
    assert unload(engine, "all").status_code == 200


def test_an_adapter_reloaded_under_its_name_never_gets_the_previous_loads_kv(engine, fresh, model_dir, adapters):
    """A LoRA weight sync (unload, load new weights under the same name) between two turns of an episode."""
    assert load(engine, "policy", adapters["all"]).status_code == 200
    prompt = list(range(200, 220))
    first = turn(engine, prompt, 3, "policy")
    follow = prompt + first["output_ids"] + [230, 231]
    before = engine.batcher.lora.weights_of("policy")
    assert unload(engine, "policy").status_code == 200
    assert load(engine, "policy", adapters["mlp"]).status_code == 200
    assert engine.batcher.lora.weights_of("policy") != before  # the cache key of its KV: a new generation

    again = turn(engine, follow, 4, "policy")
    then_prompt = follow + again["output_ids"] + [232]
    then = turn(engine, then_prompt, 5, "policy")

    assert again["meta_info"]["cached_tokens"] == 0
    assert_outputs_match(model_dir, adapters["mlp"], follow, again)
    assert then["meta_info"]["cached_tokens"] == reused(follow, again)  # the new load's own KV serves
    assert_outputs_match(model_dir, adapters["mlp"], then_prompt, then)
    assert unload(engine, "policy").status_code == 200


def test_base_and_adapter_requests_never_get_each_others_cached_kv(engine, fresh, model_dir, adapters):
    assert load(engine, "all", adapters["all"]).status_code == 200
    a_prompt, b_prompt = list(range(300, 320)), list(range(400, 420))
    adapted, based = turn(engine, a_prompt, 6, "all"), turn(engine, b_prompt, 7)
    a_follow = a_prompt + adapted["output_ids"] + [330, 331]
    b_follow = b_prompt + based["output_ids"] + [430, 431]

    base_after_adapter = turn(engine, a_follow, 8)  # a base request extending an adapter's sequence
    adapter_after_base = turn(engine, b_follow, 9, "all")  # and the reverse
    own_adapter = turn(engine, a_follow, 10, "all")
    own_base = turn(engine, b_follow, 11)

    assert base_after_adapter["meta_info"]["cached_tokens"] == 0
    assert adapter_after_base["meta_info"]["cached_tokens"] == 0
    assert_outputs_match(model_dir, None, a_follow, base_after_adapter)
    assert_outputs_match(model_dir, adapters["all"], b_follow, adapter_after_base)
    # each still hits its own weights' entry, not the longer one the other weights left since
    assert own_adapter["meta_info"]["cached_tokens"] == reused(a_prompt, adapted)
    assert own_base["meta_info"]["cached_tokens"] == reused(b_prompt, based)
    assert_outputs_match(model_dir, adapters["all"], a_follow, own_adapter)
    assert_outputs_match(model_dir, None, b_follow, own_base)
    assert unload(engine, "all").status_code == 200


def test_a_batch_mixing_base_and_adapter_turns_serves_each_from_its_own_kv(engine, fresh, model_dir, adapters):
    for name in ("attn-rslora", "mlp"):
        assert load(engine, name, adapters[name]).status_code == 200
    names = [None, "attn-rslora", "mlp"]

    def both(prompts: list[list[int]], seed: int) -> list[dict[str, Any]]:
        body = {"input_ids": prompts, "return_logprob": True, "lora_path": names,
                "sampling_params": [{"max_new_tokens": 6, "temperature": 1.0, "sampling_seed": seed + i,
                                     "ignore_eos": True} for i in range(len(prompts))]}
        return post(engine, "/generate", body).json()

    firsts = [list(range(500 + 30 * i, 520 + 30 * i)) for i in range(3)]
    first = both(firsts, 20)
    follows = [p + r["output_ids"] + [700, 701] for p, r in zip(firsts, first, strict=True)]
    second = both(follows, 30)

    for name, prompt, r1, follow, r2 in zip(names, firsts, first, follows, second, strict=True):
        adapter = adapters[name] if name else None
        assert r1["meta_info"]["cached_tokens"] == 0
        assert r2["meta_info"]["cached_tokens"] == reused(prompt, r1)
        assert_outputs_match(model_dir, adapter, prompt, r1)
        assert_outputs_match(model_dir, adapter, follow, r2)
    for name in ("attn-rslora", "mlp"):
        assert unload(engine, name).status_code == 200


def test_unload_then_load_again_under_the_same_name_serves_the_new_weights(engine, model_dir, adapters):
    """A weight sync of the adapter: unload the old one, load the new folder under the same name."""
    assert load(engine, "policy", adapters["all"]).status_code == 200
    first = post(engine, "/generate", sampled(PROMPTS[1], 5, lora_path="policy")).json()
    reply = unload(engine, "policy")
    assert reply.status_code == 200 and reply.json()["loaded_adapters"] == {}

    gone = post(engine, "/generate", sampled(PROMPTS[1], 5, lora_path="policy"))
    assert gone.status_code == 400 and "not loaded" in gone.json()["error"]["message"]
    assert load(engine, "policy", adapters["mlp"]).status_code == 200
    second = post(engine, "/generate", sampled(PROMPTS[1], 5, lora_path="policy")).json()

    assert_matches(model_dir, adapters["all"], PROMPTS[1], first)
    assert_matches(model_dir, adapters["mlp"], PROMPTS[1], second)
    assert unload(engine, "policy").status_code == 200


def _write(folder: Path, config: dict[str, Any] | None = None, tensors: dict[str, torch.Tensor] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (folder / "adapter_config.json").write_text(json.dumps(config))
    if tensors is not None:
        save_file(tensors, str(folder / "adapter_model.safetensors"))
    return folder


def test_folders_the_engine_cannot_serve_are_refused_with_a_reason(engine, adapters, tmp_path):
    good = json.loads((adapters["all"] / "adapter_config.json").read_text())
    q = "base_model.model.model.layers.0.self_attn.q_proj"
    pair = {f"{q}.lora_A.weight": torch.zeros(4, 64), f"{q}.lora_B.weight": torch.zeros(64, 4)}
    pickled = _write(tmp_path / "pickled", good)
    torch.save(pair, pickled / "adapter_model.bin")
    garbage = _write(tmp_path / "garbage", good)
    (garbage / "adapter_model.safetensors").write_bytes(b"\xff" * 64)
    cases = {
        "missing": (tmp_path / "nowhere", "is not a folder"),
        "no config": (_write(tmp_path / "noconfig", None, pair), "has no adapter_config.json"),
        "dora": (_write(tmp_path / "dora", {**good, "use_dora": True}, pair), "['use_dora']"),
        "pickle only": (pickled, "safetensors only"),
        "garbage weights": (garbage, "not a readable safetensors file"),
        "other model": (_write(tmp_path / "wide", good, {f"{q}.lora_A.weight": torch.zeros(4, 128),
                                                         f"{q}.lora_B.weight": torch.zeros(64, 4)}), "do not fit"),
        "half a pair": (_write(tmp_path / "half", good, {f"{q}.lora_A.weight": torch.zeros(4, 64)}), "without its partner"),
        "not linear": (_write(tmp_path / "embed", good, {
            "base_model.model.model.embed_tokens.lora_A.weight": torch.zeros(4, 64),
            "base_model.model.model.embed_tokens.lora_B.weight": torch.zeros(64, 4)}), "not a Linear layer"),
        "other names": (_write(tmp_path / "names", good, {"model.q.weight": torch.zeros(2, 2)}), "not a LoRA factor"),
    }
    (_write(tmp_path / "notjson", None, pair) / "adapter_config.json").write_text("{")
    cases["not json"] = (tmp_path / "notjson", "is not JSON")

    for case, (folder, why) in cases.items():
        reply = load(engine, case, folder)
        assert reply.status_code == 400, (case, reply.text)
        body = reply.json()
        assert body["success"] is False and why in body["error_message"], (case, body)
        assert case not in body["loaded_adapters"]

    assert load(engine, "x", adapters["mlp"]).status_code == 200
    twice = load(engine, "x", adapters["mlp"])
    assert twice.status_code == 400 and "already exists" in twice.json()["error_message"]
    extra = post(engine, "/load_lora_adapter", {**load_adapter_body("y", adapters["mlp"]), "lora_scale": 2})
    assert extra.status_code == 400 and "unknown fields ['lora_scale']" in extra.json()["error_message"]
    no_path = post(engine, "/load_lora_adapter", {"lora_name": "y"})
    assert no_path.status_code == 400 and "needs lora_path" in no_path.json()["error_message"]
    assert unload(engine, "x").status_code == 200
    missing = unload(engine, "x")
    assert missing.status_code == 400 and "does not exist" in missing.json()["error_message"]
    bad = post(engine, "/generate", {"input_ids": [5, 6], "lora_path": 3})
    assert bad.status_code == 400 and "lora_path must be the name" in bad.json()["error"]["message"]
    single_list = post(engine, "/generate", {"input_ids": [5, 6], "lora_path": ["x"]})
    assert single_list.status_code == 400 and "holds one prompt" in single_list.json()["error"]["message"]
    assert httpx.get(f"{engine.url}/health_generate", timeout=60).status_code == 200  # still serving


def test_the_engine_client_loads_and_unloads_adapters(engine, model_dir, adapters):
    """RolloutEngine.load_lora_adapter / unload_lora_adapter (slime.engine.base) against the real engine:
    what a LoRA run's adapter sync calls; a refused folder is an EngineError carrying the engine's reason."""
    client = EngineClient(engine.url)
    try:
        assert client.load_lora_adapter("synced", str(adapters["mlp"])) == {"synced": str(adapters["mlp"])}
        result = post(engine, "/generate", sampled(PROMPTS[0], 9, lora_path="synced")).json()
        assert_matches(model_dir, adapters["mlp"], PROMPTS[0], result)
        with pytest.raises(EngineError, match="already exists"):
            client.load_lora_adapter("synced", str(adapters["all"]))
        assert client.unload_lora_adapter("synced") == {}
    finally:
        client.shutdown()


def test_a_bf16_engine_serves_adapters_in_bf16(model_dir, adapters):
    """The bf16 engine (what SGLang serves) applies the factors in bf16: peft's fp32 log-probs within bf16's
    rounding (the fp32 engine above matches them to 2e-5)."""
    engine = CPUEngine(model_dir, port=0, seed=0, dtype="bfloat16")
    engine.start()
    try:
        assert load(engine, "all", adapters["all"]).status_code == 200
        result = post(engine, "/generate", sampled(PROMPTS[0], 4, lora_path="all")).json()
    finally:
        engine.shutdown()
    output = [tok for _, tok, _ in result["meta_info"]["output_token_logprobs"]]
    ref = reference(model_dir, adapters["all"], PROMPTS[0] + output)
    want = [ref[len(PROMPTS[0]) - 1 + i, tok].item() for i, tok in enumerate(output)]
    assert [lp for lp, _, _ in result["meta_info"]["output_token_logprobs"]] == pytest.approx(want, abs=0.15)
