"""LoRA on the torch backend (slime/backends/lora.py): what trains, what is saved, synced and merged.

Real peft (its injection, `save_pretrained` format, `PeftModel.from_pretrained`, `merge_and_unload`) on the
tiny Qwen3; the FSDP2 test runs this file as a worker script, one CPU process per rank over gloo, as
test_data_parallel.py does.

    python tests/slime/test_lora_trainer.py worker MODEL_DIR OUT RANK WORLD PORT   # one FSDP2 rank
"""

from __future__ import annotations

import copy
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3ForCausalLM

from slime.algorithms.losses import PolicyLossConfig
from slime.arguments import ArgumentError, parse_args
from slime.backends import lora as lora_mod
from slime.backends.distributed import init_data_parallel, shard_by_tokens
from slime.backends.lora import LoraSettings
from slime.backends.torch_backend import TorchTrainer, TrainerConfig
from slime.models.tiny import build_config
from slime.utils.types import Sample

REPO = Path(__file__).resolve().parents[2]
VOCAB = 512
SETTINGS = LoraSettings(rank=4, alpha=8.0)  # all-linear: every projection of both blocks
CONFIG = TrainerConfig(lr=1e-2, adam_eps=1e-3, max_tokens_per_micro_batch=40)


def tiny_model(seed: int = 0) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(build_config(VOCAB, eos_id=VOCAB - 1, pad_id=0))


def batch(n: int, seed: int) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt, response = rng.randrange(2, 9), rng.randrange(1, 9)
        tokens = [rng.randrange(1, VOCAB) for _ in range(prompt + response)]
        mask = [1] + [int(rng.random() > 0.2) for _ in range(response - 1)]  # at least one trained token
        out.append(Sample(index=i, tokens=tokens, response_length=response, loss_mask=mask))
    return out


def advantages(samples: list[Sample]) -> list[float]:
    return [(-1.0) ** i * (0.5 + 0.1 * i) for i in range(len(samples))]


def lora_trainer(settings: LoraSettings | None = SETTINGS, seed: int = 0, **kwargs) -> TorchTrainer:
    return TorchTrainer(tiny_model(seed), CONFIG, lora=settings, **kwargs)


def trained(steps: int = 2) -> TorchTrainer:
    """A LoRA trainer after `steps` steps: both factors moved (B starts at 0, so A moves from step 2 on)."""
    trainer = lora_trainer()
    for step in range(steps):
        samples = batch(6, seed=step)
        trainer.train_step(samples, advantages(samples))
    return trainer


def split(named: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    adapter = {k: v for k, v in named.items() if lora_mod.is_adapter_name(k)}
    return adapter, {k: v for k, v in named.items() if k not in adapter}


def params(trainer: TorchTrainer) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in trainer.model.named_parameters()}


def max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


# ---- what trains ---------------------------------------------------------------------------------


def test_only_the_adapters_train_and_the_base_stays_bit_identical():
    trainer = lora_trainer()
    before = params(trainer)
    adapter, base = split(before)
    assert adapter and all(".base_layer." in k for k in base if "proj" in k)  # every projection adapted
    optimized = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for _, p in lora_mod.adapter_parameters(trainer.model)}
    probe = batch(4, seed=9)
    lp_before = trainer.compute_log_probs(probe)
    for step in range(2):
        samples = batch(6, seed=step)
        metrics = trainer.train_step(samples, advantages(samples))
        assert metrics["grad_norm"] > 0
    after = params(trainer)
    for name, value in base.items():
        assert torch.equal(after[name], value), name
    for name, value in adapter.items():
        assert not torch.equal(after[name], value), f"{name} did not train"
    assert max_diff(trainer.compute_log_probs(probe), lp_before) > 1e-4


def test_gradient_checkpointing_trains_the_adapters_the_same():
    """--recompute-granularity full (HF gradient checkpointing) with a frozen base: same adapter update."""
    from dataclasses import replace

    plain, recomputed = lora_trainer(), TorchTrainer(tiny_model(), replace(CONFIG, gradient_checkpointing=True),
                                                     lora=SETTINGS)
    for step in range(2):
        samples = batch(6, seed=step)
        plain.train_step(samples, advantages(samples))
        recomputed.train_step(samples, advantages(samples))
    expected = plain.adapter_tensors()
    for key, value in recomputed.adapter_tensors().items():
        torch.testing.assert_close(value, expected[key], atol=1e-6, rtol=0, msg=key)
    assert all(v.abs().sum() > 0 for k, v in expected.items() if "lora_B" in k)  # B left its zero init: it trained


def test_the_kl_reference_of_a_lora_run_is_the_base_with_adapters_off_and_no_second_copy():
    """ref_is_base: reference log-probs come from the frozen base under the (trained) adapters, equal to a
    separately held base model's, while the policy's log-probs differ; the KL step uses them; the trainer
    then holds one copy of the weights fewer than with a reference model."""
    trainer = trained()
    trainer_with_copy = TorchTrainer(tiny_model(), CONFIG, lora=SETTINGS, ref_model=tiny_model())
    samples = batch(5, seed=9)
    base_only = TorchTrainer(tiny_model(), CONFIG, lora=SETTINGS, ref_is_base=True)
    for step in range(2):  # the same steps as trained(): same seeded adapters, same batches
        for t in (base_only, trainer_with_copy):
            t.train_step(batch(6, seed=step), advantages(batch(6, seed=step)))
    ref = base_only.compute_ref_log_probs(samples)
    expected = trainer_with_copy.compute_ref_log_probs(samples)
    policy = base_only.compute_log_probs(samples)
    flat = lambda rows: torch.tensor([x for row in rows for x in row])  # noqa: E731
    assert torch.allclose(flat(ref), flat(expected), atol=1e-6)
    assert not torch.allclose(flat(policy), flat(ref), atol=1e-3)  # the adapters are on again afterwards
    assert torch.allclose(flat(policy), flat(trainer.compute_log_probs(samples)), atol=1e-6)

    kl = PolicyLossConfig(kl_loss_coef=0.1)
    metrics = base_only.train_step(samples, advantages(samples), kl)
    assert metrics["kl_loss"] > 0

    weights = sum(p.numel() * p.element_size() for p in tiny_model().parameters())
    trainer_with_copy.train_step(samples, advantages(samples), kl)
    assert trainer_with_copy.memory()["state_bytes"] - base_only.memory()["state_bytes"] == weights
    full = TorchTrainer(tiny_model(), CONFIG)
    full.train_step(samples, advantages(samples))
    held, lora_held = full.memory()["state_bytes"], base_only.memory()["state_bytes"]
    assert held >= 3 * weights  # weights and two AdamW moments (gradients are freed after the step)
    adapter = lora_mod.tensor_bytes(base_only.adapter_tensors())
    steps = 4 * len(base_only.adapter_tensors())  # AdamW's per-tensor step counters (fp32 scalars)
    assert lora_held == weights + 3 * adapter + steps  # frozen base, adapters and their two moments
    assert base_only.memory()["peak_bytes"] > lora_held
    with pytest.raises(ValueError, match="ref_is_base needs lora"):
        TorchTrainer(tiny_model(), CONFIG, ref_is_base=True)


def test_adapter_tensors_are_peft_keys_and_a_small_fraction_of_the_model():
    trainer = trained(1)
    tensors = trainer.adapter_tensors()
    from peft import get_peft_model_state_dict

    own = get_peft_model_state_dict(trainer.peft_model)  # peft's own naming of the same adapter
    assert tensors.keys() == own.keys()
    for key, value in own.items():
        assert torch.equal(tensors[key], value), key
    # r x (in + out) floats per adapted linear layer, counted from the modules themselves
    linears = [m for name, m in trainer.model.named_modules()
               if name.rsplit(".", 1)[-1] in SETTINGS.target_modules]
    expected = sum(SETTINGS.rank * (m.in_features + m.out_features) * 4 for m in linears)
    assert len(linears) == 2 * 7 and lora_mod.tensor_bytes(tensors) == expected
    model_bytes = sum(p.numel() * p.element_size() for p in trainer.model.parameters() if p.requires_grad is False)
    assert lora_mod.tensor_bytes(tensors) < 0.1 * model_bytes
    half = trainer.adapter_tensors("bfloat16")
    assert lora_mod.tensor_bytes(half) * 2 == expected and all(v.dtype == torch.bfloat16 for v in half.values())


# ---- adapter folders -----------------------------------------------------------------------------


def test_saved_adapter_is_peft_format_that_peft_and_a_fresh_trainer_load(tmp_path):
    trainer = trained(2)
    probe = batch(5, seed=7)
    expected = trainer.compute_log_probs(probe)
    folder = Path(trainer.save_adapter(tmp_path / "adapter"))
    assert sorted(p.name for p in folder.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    config = json.loads((folder / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", 4, 8.0)
    assert sorted(config["target_modules"]) == sorted(SETTINGS.target_modules)

    from peft import PeftModel

    loaded = PeftModel.from_pretrained(tiny_model(), str(folder))  # peft itself reads the folder
    assert trainer.compute_log_probs(probe, model=loaded.get_base_model()) == expected

    resumed = lora_trainer(LoraSettings(rank=4, alpha=8.0, adapter_path=str(folder)))  # --lora-adapter-path
    assert resumed.compute_log_probs(probe) == expected
    with pytest.raises(ValueError, match="--lora-rank 8"):
        lora_trainer(LoraSettings(rank=8, alpha=8.0, adapter_path=str(folder)))


# ---- merged weights ------------------------------------------------------------------------------


def test_merged_export_is_a_plain_hf_model_with_the_adapted_outputs(tmp_path):
    trainer = trained(2)
    probe = batch(8, seed=3)
    expected = trainer.compute_log_probs(probe)
    out = trainer.export_hf(tmp_path / "merged")
    plain = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    names = [name for name, _ in plain.named_parameters()]
    assert not any("lora" in n or "base_layer" in n for n in names)
    assert not (Path(out) / "adapter_config.json").exists()
    assert max_diff(trainer.compute_log_probs(probe, model=plain), expected) < 1e-5

    # peft's own merge of the same adapter gives the same weights
    merged = copy.deepcopy(trainer.peft_model).merge_and_unload()
    for name, value in merged.state_dict().items():
        torch.testing.assert_close(plain.state_dict()[name], value, atol=1e-7, rtol=0, msg=name)
    # the tensor weight sync sends the merged weights under HF names, not the base under peft's
    synced = dict(trainer.hf_named_tensors())
    assert synced.keys() == {k for k in merged.state_dict() if k != "lm_head.weight"}
    for name, value in synced.items():
        torch.testing.assert_close(value, plain.state_dict()[name], atol=1e-7, rtol=0, msg=name)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A tiny HF folder with a tokenizer, for the CPU engine (`engine` fixture, tests/slime/conftest.py)."""
    from slime.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("lora_sync") / "tiny", seed=0)


def test_full_weight_syncs_of_a_lora_trainer_send_the_merged_weights(engine, model_dir, tmp_path):
    """Today's syncs (tensor by shared memory, disk) put base + adapter into the real CPU engine, merged."""
    from slime.weight_sync import DiskWeightSync, TensorWeightSync

    trainer = TorchTrainer(str(model_dir), CONFIG, lora=SETTINGS)
    for step, sync in enumerate([TensorWeightSync("shm"), DiskWeightSync(tmp_path / "weights")]):
        samples = batch(6, seed=step)
        trainer.train_step(samples, advantages(samples))
        sync.sync(trainer, [engine], version=step + 1)
        served = engine.batcher.model.state_dict()
        for name, value in trainer._full_hf_state().items():
            assert torch.equal(served[name], value), (sync.transport, name)


# ---- checkpoints -----------------------------------------------------------------------------------


def test_checkpoint_resume_restores_adapter_and_optimizer_exactly(tmp_path):
    trainer = trained(1)
    trainer.save_checkpoint(tmp_path / "ck", data_state={"rollout_id": 1})
    probe = batch(5, seed=11)
    saved_lp = trainer.compute_log_probs(probe)
    samples = batch(6, seed=1)
    expected = trainer.train_step(samples, advantages(samples))
    expected_adapter = trainer.adapter_tensors()

    iteration = tmp_path / "ck" / "iter_0000001"
    payload = json.loads((iteration / "trainer_state.json").read_text())
    assert payload["lora"] == SETTINGS.describe() and payload["master_weights"] == "trainer"
    adapter_bytes = lora_mod.tensor_bytes(expected_adapter)
    assert payload["bytes"]["master"] == payload["bytes"]["adapter"] == adapter_bytes
    assert (iteration / "adapter" / "adapter_model.safetensors").is_file()
    import torch.distributed.checkpoint as dcp

    held = dcp.FileSystemReader(str(iteration / "trainer")).read_metadata().state_dict_metadata
    names = {"lm." + lora_mod._param_name(key, "") for key in expected_adapter}
    assert {k.removeprefix("model.") for k in held if k.startswith("model.")} == names  # the adapter, not the base
    assert {k.removeprefix("optimizer.state.").rsplit(".", 1)[0] for k in held
            if k.startswith("optimizer.state.")} == names  # and its moments
    plain = AutoModelForCausalLM.from_pretrained(iteration / "model", dtype=torch.float32)  # merged, servable
    assert max_diff(trainer.compute_log_probs(probe, model=plain), saved_lp) < 1e-5  # the weights of the save

    resumed = lora_trainer(seed=0)
    info = resumed.load_checkpoint(tmp_path / "ck")
    assert info["step"] == 1 and info["data_state"] == {"rollout_id": 1}
    assert resumed.compute_log_probs(probe) == saved_lp
    got = resumed.train_step(samples, advantages(samples))
    for key in ("loss", "grad_norm", "lr", "pg_loss"):
        assert got[key] == expected[key], key
    for key, value in resumed.adapter_tensors().items():
        assert torch.equal(value, expected_adapter[key]), key


def test_checkpoints_of_another_kind_or_shape_are_refused(tmp_path):
    lora = trained(1)
    lora.save_checkpoint(tmp_path / "lora")
    full = lora_trainer(None)
    full.save_checkpoint(tmp_path / "full")
    with pytest.raises(ValueError, match="is a LoRA checkpoint"):
        lora_trainer(None).load_checkpoint(tmp_path / "lora")
    with pytest.raises(ValueError, match="full fine-tuning checkpoint"):
        lora_trainer().load_checkpoint(tmp_path / "full")
    with pytest.raises(ValueError, match="this trainer's is"):
        lora_trainer(LoraSettings(rank=2, alpha=8.0)).load_checkpoint(tmp_path / "lora")
    with pytest.raises(ValueError, match="trained on other base weights"):
        lora_trainer(seed=1).load_checkpoint(tmp_path / "lora")  # another --hf-checkpoint


# ---- flags -----------------------------------------------------------------------------------------


BASE_ARGV = ["--hf-checkpoint", "unused", "--prompt-data", "unused.jsonl", "--rollout-batch-size", "1",
             "--num-rollout", "1"]


def test_flags_parse_with_upstream_names_and_rank_zero_is_full_fine_tuning():
    args = parse_args(BASE_ARGV)
    assert args.lora_rank == 0 and LoraSettings.from_args(args) is None
    full = lora_trainer(None)
    assert full.lora is None and full.peft_model is None
    assert not any(lora_mod.is_adapter_name(n) or ".base_layer." in n for n, _ in full.model.named_parameters())
    assert all(p.requires_grad for p in full.model.parameters())

    args = parse_args(BASE_ARGV + ["--lora-rank", "8", "--lora-alpha", "32", "--target-modules", "q_proj, v_proj,o_proj",
                                   "--exclude-modules", "o_proj", "--lora-dropout", "0.05"])
    assert LoraSettings.from_args(args) == LoraSettings(rank=8, alpha=32.0, target_modules=("q_proj", "v_proj"),
                                                        dropout=0.05)
    assert LoraSettings.from_args(parse_args(BASE_ARGV + ["--lora-rank", "2"])).target_modules == lora_mod.ALL_LINEAR


@pytest.mark.parametrize("extra, message", [
    (["--lora-rank", "-1"], "--lora-rank must be >= 0"),
    (["--lora-rank", "4", "--train-backend", "megatron"], "torch and fsdp only"),
    (["--lora-rank", "4", "--lora-alpha", "0"], "--lora-alpha must be > 0"),
    (["--lora-rank", "4", "--lora-dropout", "1"], r"--lora-dropout must be in \[0, 1\)"),
    (["--lora-rank", "4", "--target-modules", "q_proj", "--exclude-modules", "q_proj"], "leaves no module"),
    (["--lora-adapter-path", "/x"], "needs --lora-rank > 0"),
])
def test_bad_lora_flags_are_refused_with_a_sentence(extra, message):
    with pytest.raises(ArgumentError, match=message):
        parse_args(BASE_ARGV + extra)


def test_unknown_target_modules_are_refused():
    with pytest.raises(ValueError, match=r"not module names of Qwen3ForCausalLM.*fix --target-modules"):
        lora_trainer(LoraSettings(rank=2, target_modules=("query",)))
    with pytest.raises(ValueError, match="not an nn.Linear"):
        lora_trainer(LoraSettings(rank=2, target_modules=("embed_tokens",)))


# ---- FSDP2 ---------------------------------------------------------------------------------------


def run_rank(model_dir: str, out: str, rank: int, world: int, port: int) -> None:
    """One rank: FSDP2 + LoRA, two steps on this rank's shard of each batch, then a checkpoint."""
    dp = init_data_parallel(rank, world, "127.0.0.1", port, fsdp=True, timeout_minutes=1)
    trainer = TorchTrainer(model_dir, CONFIG, dp=dp, lora=SETTINGS)
    for step in range(2):
        samples = batch(6, seed=step)
        shard = shard_by_tokens([len(s.tokens) for s in samples], world)[rank]
        adv = advantages(samples)
        trainer.train_step([samples[i] for i in shard], [adv[i] for i in shard])
    tensors = trainer.adapter_tensors()
    merged = trainer._full_hf_state()  # gathered to rank 0
    synced = {name: t.cpu() for name, t in trainer.hf_named_tensors()}  # the tensor sync's, gathered on every rank
    trainer.save_checkpoint(Path(out).with_suffix(".ck"))
    if rank == 0:
        torch.save({"adapter": tensors, "merged": merged, "synced": synced}, out)
    dp.close()


def test_fsdp2_ranks_with_lora_match_one_rank_and_checkpoint_across(tmp_path):
    model_dir = tmp_path / "model"
    tiny_model().save_pretrained(model_dir)
    from slime.utils.misc import free_port

    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1", TRANSFORMERS_VERBOSITY="error", CUDA_VISIBLE_DEVICES="")
    port, out = str(free_port("127.0.0.1")), tmp_path / "fsdp.pt"
    procs = [subprocess.Popen([sys.executable, __file__, "worker", str(model_dir), str(out), str(rank), "2", port],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in range(2)]
    one = TorchTrainer(str(model_dir), CONFIG, lora=SETTINGS)  # the same steps on one rank, meanwhile
    for step in range(2):
        samples = batch(6, seed=step)
        one.train_step(samples, advantages(samples))
    for proc in procs:
        try:
            output, _ = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        assert proc.returncode == 0, output[-3000:]
    got = torch.load(out)
    expected = one.adapter_tensors()
    assert got["adapter"].keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(got["adapter"][key], value, atol=2e-6, rtol=0, msg=key)
    for key, value in one._full_hf_state().items():
        torch.testing.assert_close(got["merged"][key], value, atol=2e-6, rtol=0, msg=key)
        torch.testing.assert_close(got["synced"][key], value, atol=2e-6, rtol=0, msg=key)
    assert got["synced"].keys() == got["merged"].keys()
    # the two-rank save resumes in one process: its adapter, and the same log-probs
    resumed = TorchTrainer(str(model_dir), CONFIG, lora=SETTINGS)
    resumed.load_checkpoint(out.with_suffix(".ck"))
    for key, value in got["adapter"].items():
        assert torch.equal(resumed.adapter_tensors()[key], value), key


@pytest.mark.parametrize("targets", ["all-linear", "q_proj,v_proj"])
def test_adapter_parameter_count_from_the_config_alone_is_what_peft_creates(tmp_path, targets):
    """The launcher's disk budget sizes a LoRA save from config.json (a meta-device model): r x (in + out) per
    targeted Linear must be exactly the number of factor parameters peft injects into the real model."""
    settings = LoraSettings(rank=4, alpha=8.0, target_modules=lora_mod.parse_target_modules(targets))
    build_config(VOCAB, eos_id=VOCAB - 1, pad_id=0).save_pretrained(tmp_path)
    counted = lora_mod.adapter_parameter_count(tmp_path, settings)
    model = tiny_model()
    lora_mod.apply_lora(model, settings)
    created = sum(p.numel() for _, p in lora_mod.adapter_parameters(model))
    assert counted == created > 0
    assert counted == sum(p.numel() for p in model.parameters() if p.requires_grad)  # all that trains
    assert len(lora_mod.adapter_parameters(model)) == 2 * 2 * len(settings.target_modules)  # A, B x 2 blocks


if __name__ == "__main__" and sys.argv[1:2] == ["worker"]:
    torch.set_num_threads(1)
    model_dir_, out_, rank_, world_, port_ = sys.argv[2:7]
    run_rank(model_dir_, out_, int(rank_), int(world_), int(port_))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as tests/slime/dp_worker.py: skip interpreter finalization after the group is gone
