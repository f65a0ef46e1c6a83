"""The torch backend on a tiny random Qwen3: log-prob alignment, batching, training steps, checkpoints."""

import copy
import json
import random

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3ForCausalLM

from slime.algorithms.losses import PolicyLossConfig
from slime.backends import checkpoint as ckpt
from slime.backends.batching import pack_micro_batch, plan_micro_batches, scatter_back
from slime.backends.torch_backend import TorchTrainer, TrainerConfig
from slime.models.tiny import build_config
from slime.utils.types import Sample

VOCAB = 512


def tiny_model(seed: int = 0) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(build_config(VOCAB, eos_id=VOCAB - 1, pad_id=0))  # the project's tiny architecture


def sample(prompt_len: int, response_len: int, seed: int, loss_mask: list[int] | None = None) -> Sample:
    rng = random.Random(seed)
    tokens = [rng.randrange(1, VOCAB) for _ in range(prompt_len + response_len)]
    return Sample(index=seed, tokens=tokens, response_length=response_len, loss_mask=loss_mask)


def mixed_samples() -> list[Sample]:
    return [sample(5, 7, 1), sample(12, 3, 2), sample(2, 10, 3), sample(8, 8, 4)]


def params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same_params(a: dict, b: dict, atol: float = 0.0) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=atol, rtol=0, msg=key)


# ---- alignment and batching ------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_log_probs_are_log_softmax_at_the_previous_position(temperature):
    model = tiny_model()
    s = Sample(tokens=[11, 12, 13, 14, 101, 102, 103], response_length=3, loss_mask=[1, 0, 1])
    got = TorchTrainer(model).compute_log_probs([s], temperature)

    with torch.no_grad():
        logits = model(torch.tensor([s.tokens])).logits[0].float()
    table = torch.log_softmax(logits / temperature, dim=-1)
    # Response tokens sit at positions 4, 5, 6 and are predicted from positions 3, 4, 5.
    expected = [table[3, 101].item(), table[4, 102].item(), table[5, 103].item()]
    assert got[0] == pytest.approx(expected, abs=1e-6)


def test_pack_micro_batch_layout():
    a = Sample(tokens=[10, 11, 12, 13, 14], response_length=2, rollout_log_probs=[-0.5, -0.25])
    b = Sample(tokens=[20, 21, 22], response_length=2, loss_mask=[0, 1], rollout_log_probs=[-1.0, -2.0])
    mb = pack_micro_batch([a, b], [0, 1], advantages=[[1.0, 2.0], [3.0, 4.0]], pad_token_id=0)

    assert mb.input_ids.tolist() == [[10, 11, 12, 13, 14], [20, 21, 22, 0, 0]]
    assert mb.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 3, 4]]
    assert mb.logit_index.tolist() == [[2, 3], [0, 1]]
    assert mb.target_ids.tolist() == [[13, 14], [21, 22]]
    assert mb.loss_mask.tolist() == [[1.0, 1.0], [0.0, 1.0]]
    assert mb.rollout_log_probs.tolist() == [[-0.5, -0.25], [-1.0, -2.0]]
    assert mb.advantages.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    with pytest.raises(ValueError, match="no prompt token"):
        pack_micro_batch([Sample(tokens=[1, 2], response_length=2)], [0])


def test_log_probs_do_not_depend_on_batch_padding():
    samples = mixed_samples()
    trainer = TorchTrainer(tiny_model(), TrainerConfig(max_tokens_per_micro_batch=None))
    together = trainer.compute_log_probs(samples, 0.8)
    for s, batched in zip(samples, together, strict=True):
        alone = trainer.compute_log_probs([s], 0.8)[0]
        assert len(batched) == s.response_length
        assert batched == pytest.approx(alone, abs=1e-5)


def test_first_fit_decreasing_plan():
    # Longest first: 9(#1) 9(#3) 7(#5) 5(#0) 3(#2) 2(#4); a micro-batch costs samples x its longest.
    assert plan_micro_batches([5, 9, 3, 9, 2, 7], max_tokens=18) == [[1, 3], [5, 0], [2, 4]]
    assert plan_micro_batches([30, 2], max_tokens=10) == [[0], [1]]  # too long: alone, not dropped
    assert plan_micro_batches([4, 4, 4], max_tokens=None, max_samples=2) == [[0, 1], [2]]
    lengths = [random.Random(7).randrange(1, 60) for _ in range(40)]
    plan = plan_micro_batches(lengths, max_tokens=100)
    assert sorted(i for members in plan for i in members) == list(range(40))
    assert all(len(m) * max(lengths[i] for i in m) <= 100 for m in plan)
    assert scatter_back([[2, 0], [1]], [["c", "a"], ["b"]], 3) == ["a", "b", "c"]


def test_budget_split_scatters_results_back_in_order():
    samples = mixed_samples()
    one = TorchTrainer(tiny_model(), TrainerConfig(max_tokens_per_micro_batch=None))
    split = TorchTrainer(one.model, TrainerConfig(max_tokens_per_micro_batch=20))
    assert len(split.plan(samples)) > 1
    whole = one.compute_log_probs(samples)
    pieces = split.compute_log_probs(samples)
    for a, b in zip(whole, pieces, strict=True):
        assert a == pytest.approx(b, abs=1e-5)


# ---- training --------------------------------------------------------------------------------


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_advantage_sign_moves_the_response_log_prob(sign):
    s = sample(6, 6, 11)
    trainer = TorchTrainer(tiny_model(), TrainerConfig(lr=1e-2))
    before = sum(trainer.compute_log_probs([s])[0])
    for _ in range(3):
        metrics = trainer.train_step([s], [sign])
    after = sum(trainer.compute_log_probs([s])[0])
    assert (after - before) * sign > 0.1
    assert metrics["tokens"] == 6 and metrics["lr"] == 1e-2 and metrics["grad_norm"] > 0


def test_masked_tokens_have_no_influence():
    mask = [1, 0, 1, 0, 0, 1]
    s = sample(4, 6, 12, loss_mask=mask)
    base = tiny_model()
    results = []
    for masked_value in (0.0, 50.0):
        adv = [[1.0 if m else masked_value for m in mask]]
        trainer = TorchTrainer(copy.deepcopy(base), TrainerConfig(lr=1e-2))
        metrics = trainer.train_step([s], adv)
        results.append((params(trainer.model), metrics))
    assert_same_params(results[0][0], results[1][0])
    assert results[0][1]["loss"] == results[1][1]["loss"]
    assert results[0][1]["tokens"] == 3


def _step_recording_grads(trainer, samples, advantages, config, **kwargs):
    grads = {}
    step = trainer._clip_and_step

    def record_then_step():
        grads.update({n: p.grad.clone() for n, p in trainer.model.named_parameters()})
        return step()

    trainer._clip_and_step = record_then_step
    return trainer.train_step(samples, advantages, config, **kwargs), grads


@pytest.mark.parametrize("gradient_checkpointing", [False, True])
def test_micro_batches_accumulate_to_the_whole_batch_update(gradient_checkpointing):
    samples = mixed_samples()
    advantages = [1.0, -0.5, [0.3 * j for j in range(10)], -1.0]
    config = PolicyLossConfig(aggregation="token_mean")
    base = tiny_model()
    whole = TorchTrainer(copy.deepcopy(base), TrainerConfig(lr=1e-3, max_tokens_per_micro_batch=None))
    split = TorchTrainer(
        copy.deepcopy(base),
        TrainerConfig(
            lr=1e-3,
            max_samples_per_micro_batch=1,
            gradient_checkpointing=gradient_checkpointing,
            logits_chunk_tokens=3,  # several LM-head chunks per micro-batch
        ),
    )
    m_whole, g_whole = _step_recording_grads(whole, samples, advantages, config)
    m_split, g_split = _step_recording_grads(split, samples, advantages, config)

    assert (m_whole["num_micro_batches"], m_split["num_micro_batches"]) == (1, 4)
    assert m_split["loss"] == pytest.approx(m_whole["loss"], abs=1e-6)
    assert m_split["grad_norm"] == pytest.approx(m_whole["grad_norm"], rel=1e-5)
    assert m_split["entropy"] == pytest.approx(m_whole["entropy"], abs=1e-5)
    assert_same_params(g_whole, g_split, atol=1e-5)
    _assert_same_update_where_the_gradient_is_real(whole, split, g_whole)


def _assert_same_update_where_the_gradient_is_real(a: TorchTrainer, b: TorchTrainer, grads: dict) -> None:
    """Adam's first step moves each weight by about lr * sign(g): where a gradient is float noise
    around 0 its sign (and so the step) is arbitrary, so compare the weights where |g| is real."""
    after_a, after_b = params(a.model), params(b.model)
    compared = 0
    for key, g in grads.items():
        real = g.abs() > 1e-5
        compared += int(real.sum())
        torch.testing.assert_close(after_a[key][real], after_b[key][real], atol=1e-5, rtol=0, msg=key)
    assert compared > 0.1 * sum(g.numel() for g in grads.values())


@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean"])
def test_zero_advantage_samples_are_left_out_with_the_same_gradient_and_update(aggregation):
    samples = mixed_samples() + [sample(6, 5, 5, loss_mask=[1, 0, 1, 1, 0])]
    # samples 1 and 3 have zero advantage; sample 4's only non-zero advantage sits on a masked token
    advantages = [0.7, 0.0, [0.0] * 5 + [0.4] * 5, 0.0, [0.0, 2.0, 0.0, 0.0, 0.0]]
    config = PolicyLossConfig(aggregation=aggregation)
    base = tiny_model()
    full = TorchTrainer(copy.deepcopy(base), TrainerConfig(lr=1e-3, skip_zero_advantage=False))
    lean = TorchTrainer(copy.deepcopy(base), TrainerConfig(lr=1e-3))
    m_full, g_full = _step_recording_grads(full, samples, advantages, config)
    m_lean, g_lean = _step_recording_grads(lean, samples, advantages, config)

    assert (m_full["zero_advantage_samples"], m_lean["zero_advantage_samples"]) == (0, 3)
    assert m_lean["tokens"] == 7 + 10 < m_full["tokens"]
    assert m_lean["grad_norm"] == pytest.approx(m_full["grad_norm"], rel=1e-5)
    assert_same_params(g_full, g_lean, atol=1e-6)
    _assert_same_update_where_the_gradient_is_real(full, lean, g_full)
    # no sample to train: the optimizer still steps on a zero gradient (Adam's momentum moves on), as before
    g_full = dict(g_full)  # the recording hook stays installed: keep the first step's gradients
    m_none = lean.train_step(samples[1:2], [0.0], config)
    full.train_step(samples[1:2], [0.0], config)
    assert m_none["tokens"] == 0 and m_none["grad_norm"] == 0.0 and "entropy" not in m_none
    assert lean.step == full.step == 2
    _assert_same_update_where_the_gradient_is_real(full, lean, g_full)
    # an entropy or KL term makes every token count: nothing is left out
    with_entropy = PolicyLossConfig(aggregation=aggregation, entropy_coef=0.01)
    assert lean.train_step(samples, advantages, with_entropy)["zero_advantage_samples"] == 0


def test_default_old_log_probs_are_the_step_forward_without_a_second_forward():
    """old_log_probs=None uses the training forward's own log-probs (detached): the same update as
    passing freshly recomputed ones, with one decoder forward per micro-batch instead of two."""
    samples = mixed_samples()
    advantages = [1.0, -0.5, [0.3 * j for j in range(10)], -1.0]
    config = PolicyLossConfig(aggregation="token_mean")
    base = tiny_model()
    implicit = TorchTrainer(copy.deepcopy(base), TrainerConfig(lr=1e-3))
    explicit = TorchTrainer(copy.deepcopy(base), TrainerConfig(lr=1e-3))
    forwards = []
    implicit.model.get_decoder().register_forward_hook(lambda *_: forwards.append(1))
    old = explicit.compute_log_probs(samples)
    m_implicit, g_implicit = _step_recording_grads(implicit, samples, advantages, config)
    m_explicit, g_explicit = _step_recording_grads(explicit, samples, advantages, config, old_log_probs=old)

    assert len(forwards) == m_implicit["num_micro_batches"] == 1
    assert m_implicit["approx_kl"] == 0.0 and m_implicit["clipfrac"] == 0.0
    assert m_implicit["loss"] == pytest.approx(m_explicit["loss"], abs=1e-6)
    assert m_implicit["grad_norm"] == pytest.approx(m_explicit["grad_norm"], rel=1e-5)
    assert_same_params(g_implicit, g_explicit, atol=1e-6)
    _assert_same_update_where_the_gradient_is_real(implicit, explicit, g_implicit)


def test_kl_loss_uses_the_reference_model():
    samples = mixed_samples()
    model = tiny_model()
    trainer = TorchTrainer(model, TrainerConfig(lr=1e-2), ref_model=copy.deepcopy(model))
    config = PolicyLossConfig(kl_loss_coef=0.1, kl_loss_type="k3")
    first = trainer.train_step(samples, [1.0, -1.0, 1.0, -1.0], config)
    second = trainer.train_step(samples, [1.0, -1.0, 1.0, -1.0], config)
    assert first["kl_loss"] == pytest.approx(0.0, abs=1e-7)  # policy == reference before any step
    assert second["kl_loss"] > 0


# ---- checkpoints -----------------------------------------------------------------------------


def test_checkpoint_resume_is_exact(tmp_path):
    samples = mixed_samples()
    adv = [1.0, -1.0, 0.5, -0.5]
    config = TrainerConfig(lr=1e-2, lr_warmup_steps=3)
    trainer = TorchTrainer(tiny_model(seed=0), config)
    trainer.train_step(samples, adv)
    saved_weights = params(trainer.model)
    saved_optim = copy.deepcopy(trainer.optimizer.state_dict())
    trainer.save_checkpoint(tmp_path, data_state={"rollout_id": 1, "offset": 8})
    draw = torch.rand(3)
    expected = trainer.train_step(samples, adv)

    resumed = TorchTrainer(tiny_model(seed=99), config)
    info = resumed.load_checkpoint(tmp_path)
    assert info["step"] == 1 and info["iteration"] == 1
    assert info["data_state"] == {"rollout_id": 1, "offset": 8}
    assert_same_params(params(resumed.model), saved_weights)
    optim = resumed.optimizer.state_dict()
    for key, state in saved_optim["state"].items():
        for name, value in state.items():
            torch.testing.assert_close(optim["state"][key][name], value, atol=0, rtol=0)
    assert torch.equal(torch.rand(3), draw)  # RNG restored
    got = resumed.train_step(samples, adv)
    for key in ("loss", "grad_norm", "lr", "pg_loss"):
        assert got[key] == expected[key], key
    assert_same_params(params(resumed.model), params(trainer.model))


def test_interrupted_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    samples = mixed_samples()
    trainer = TorchTrainer(tiny_model(), TrainerConfig(lr=1e-2))
    trainer.train_step(samples, [1.0] * 4)
    trainer.save_checkpoint(tmp_path)
    first = params(trainer.model)
    trainer.train_step(samples, [1.0] * 4)

    def killed(tmp, final):
        raise KeyboardInterrupt("killed before rename")

    monkeypatch.setattr(ckpt, "_commit", killed)
    with pytest.raises(KeyboardInterrupt):
        trainer.save_checkpoint(tmp_path)
    monkeypatch.undo()

    assert (tmp_path / ckpt.LATEST_FILE).read_text().strip() == "1"
    assert not (tmp_path / "iter_0000002").exists()
    restored = TorchTrainer(tiny_model(seed=5), TrainerConfig(lr=1e-2))
    assert restored.load_checkpoint(tmp_path)["step"] == 1
    assert_same_params(params(restored.model), first)

    assert [p.name for p in tmp_path.glob("iter_0000002.tmp-*")]  # the killed save's leftover
    trainer.save_checkpoint(tmp_path)  # the next save removes it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_0000001", "iter_0000002", ckpt.LATEST_FILE]
    state = json.loads((tmp_path / "iter_0000002" / ckpt.STATE_FILE).read_text())
    assert state["state"]["step"] == 2


def test_export_hf_loads_back_with_transformers(tmp_path):
    samples = mixed_samples()
    trainer = TorchTrainer(tiny_model(), TrainerConfig(lr=1e-2))
    trainer.train_step(samples, [1.0, -1.0, 1.0, -1.0])
    out = trainer.export_hf(tmp_path / "hf")
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert_same_params(params(reloaded), params(trainer.model))
    assert TorchTrainer(reloaded).compute_log_probs(samples) == trainer.compute_log_probs(samples)


def test_checkpoint_model_folder_carries_the_tokenizer_and_chats(tmp_path):
    from transformers import AutoTokenizer

    from slime.models.tiny import build_tiny_model

    source = build_tiny_model(tmp_path / "hf", seed=0)
    trainer = TorchTrainer(str(source), TrainerConfig(lr=1e-2))
    path = trainer.save_checkpoint(tmp_path / "ckpt", tokenizer_dir=source)
    tokenizer = AutoTokenizer.from_pretrained(f"{path}/model")
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert "hi" in text and (tmp_path / "ckpt" / "iter_0000000" / "model" / "chat_template.jinja").is_file()
    assert TorchTrainer(f"{path}/model").compute_log_probs(mixed_samples()) == trainer.compute_log_probs(mixed_samples())
