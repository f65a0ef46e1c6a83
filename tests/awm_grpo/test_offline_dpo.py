"""awm_grpo.offline.dpo: the loss, the masked log-prob sums, the pairing rules, one update's direction, and the
command end to end (real tiny model, CPU engine, bundled scenarios) saving a model awm_grpo.eval loads."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from offline_helpers import TASKS, task_prompts, warm_start

from awm_grpo import eval as awm_eval
from awm_grpo.offline import dpo
from awm_grpo.offline.explore import Trajectory, explore, read_prompts, runtime_config
from slime.utils.types import Sample


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    torch.set_num_threads(1)
    return warm_start(tmp_path_factory.mktemp("offline-dpo"), tiny_model_dir)


def _traj(index: int, task: str, success: bool, tokens: list[int] | None = None,
          mask: list[int] | None = None) -> Trajectory:
    tokens = tokens or [1, 2, 3]
    mask = mask if mask is not None else [1] * (len(tokens) - 1)
    sample = Sample(index=index, tokens=list(tokens), response_length=len(mask), loss_mask=list(mask))
    return Trajectory(sample=sample, scenario=task, task_idx=0, verdict="complete" if success else "others",
                      reward=1.0 if success else 0.0, stop_reason="final_answer", turns=1)


def test_dpo_loss_matches_a_hand_computation():
    # logpi(w) = -10, logref(w) = -12, logpi(l) = -8, logref(l) = -9, beta 0.1:
    # margin = 0.1 * ((-10 + 12) - (-8 + 9)) = 0.1; loss = -log sigmoid(0.1) = log(1 + e^-0.1)
    loss, margin = dpo.dpo_loss(torch.tensor([-10.0]), torch.tensor([-8.0]), torch.tensor([-12.0]),
                                torch.tensor([-9.0]), beta=0.1)
    assert margin.item() == pytest.approx(0.1)
    assert loss.item() == pytest.approx(math.log(1 + math.exp(-0.1)), rel=1e-6)
    # a pair the policy already prefers strongly costs almost nothing; the reverse costs about |margin|
    loss, _ = dpo.dpo_loss(torch.tensor([0.0, -100.0]), torch.tensor([-100.0, 0.0]), torch.zeros(2), torch.zeros(2),
                           beta=1.0)
    assert loss[0].item() < 1e-6 and loss[1].item() == pytest.approx(100.0, rel=1e-4)


def test_sequence_logps_sum_only_the_model_tokens(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    tokens = [5, 17, 42, 99, 7, 8, 300, 301, 12, 13, 14]  # 4 prompt tokens, 7 response tokens
    mask = [1, 1, 0, 0, 0, 1, 1]  # model, model, observation x3, model, model
    samples = [Sample(index=0, tokens=tokens, response_length=7, loss_mask=mask),
               Sample(index=1, tokens=tokens[:6], response_length=2, loss_mask=[1, 0])]  # shorter: padded
    with torch.no_grad():
        got = dpo.sequence_logps(model, samples)
        full = torch.log_softmax(model(input_ids=torch.tensor([tokens])).logits[0].float(), -1)
    per_token = [full[t - 1, tokens[t]].item() for t in range(len(tokens))]  # log p(token t | tokens < t)
    prompt = len(tokens) - 7
    by_hand = sum(per_token[prompt + j] for j, m in enumerate(mask) if m)
    assert got[0].item() == pytest.approx(by_hand, abs=1e-4)
    assert got[1].item() == pytest.approx(per_token[4], abs=1e-4)  # padding changed nothing
    everything = sum(per_token[1:])
    assert abs(got[0].item() - everything) > 1.0  # the observation and prompt tokens really were left out
    with pytest.raises(ValueError, match="loss-mask entries"):
        dpo.sequence_logps(model, [Sample(index=2, tokens=tokens, response_length=7, loss_mask=[1, 1])])


def test_pairing_rules():
    trajs = [_traj(0, "a", True), _traj(1, "a", False), _traj(2, "a", True), _traj(3, "a", False),  # 2 x 2
             _traj(4, "b", True), _traj(5, "b", True),  # no failure
             _traj(6, "c", False),  # no success
             *[_traj(7 + k, "d", k < 3) for k in range(6)]]  # 3 x 3 = 9 combinations, capped at 4
    pairs, counts = dpo.pair_trajectories(trajs, pairs_per_task=4, seed=0)
    assert counts["pairs"] == len(pairs) == 8 and counts["paired_tasks"] == 2 and counts["tasks"] == 4
    assert counts["unpaired"] == {"no_success": 1, "no_failure": 1}
    assert counts["no_success_tasks"] == ["c#0"] and counts["no_failure_tasks"] == ["b#0"]
    assert len(set(pairs)) == len(pairs)  # every pair once
    for w, lo in pairs:
        assert trajs[w].success and not trajs[lo].success and trajs[w].task == trajs[lo].task
    assert [p for p in pairs if trajs[p[0]].scenario == "a"] == [(0, 1), (0, 3), (2, 1), (2, 3)]
    assert pairs == dpo.pair_trajectories(trajs, pairs_per_task=4, seed=0)[0]  # deterministic given the seed
    assert {p for p in dpo.pair_trajectories(trajs, 9, 0)[0] if trajs[p[0]].scenario == "d"} == \
        {(w, lo) for w in (7, 8, 9) for lo in (10, 11, 12)}
    with pytest.raises(ValueError):
        dpo.pair_trajectories(trajs, 0, 0)


def test_one_update_moves_the_margin_towards_the_success(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    prompt = [5, 17, 42, 99]
    trajs = [_traj(0, "t", True, prompt + [200, 201, 202, 203], [1, 1, 1, 1]),
             _traj(1, "t", False, prompt + [300, 301, 302, 303], [1, 1, 1, 1])]
    ref = dpo.reference_logps(model, trajs, {0, 1})

    def margin() -> float:
        with torch.no_grad():
            logps = dpo.sequence_logps(model.eval(), [trajs[0].sample, trajs[1].sample])
        return dpo.dpo_loss(logps[:1], logps[1:], torch.tensor([ref[0]]), torch.tensor([ref[1]]), 0.1)[1].item()

    assert margin() == pytest.approx(0.0, abs=1e-5)  # the policy is the reference before training
    history = dpo.train(model, trajs, [(0, 1)], ref, beta=0.1, epochs=1, lr=1e-3, seed=0)
    assert history[0]["pairs"] == 1 and history[0]["loss"] == pytest.approx(math.log(2), abs=1e-4)
    assert margin() > 0.01  # the chosen trajectory gained on the rejected one, relative to the reference


def test_dpo_end_to_end_saves_a_model_eval_loads(ws, tmp_path, capsys):
    prompts = task_prompts(ws.parent)
    out = tmp_path / "dpo"
    assert dpo.main(["--model", str(ws), "--prompts", str(prompts), "--out", str(out), "--samples", "6",
                     "--epochs", "2", "--seed", "3"]) == 0
    result = json.loads((out / "dpo.json").read_text())
    assert result["episodes_played"] == TASKS * 6 == result["exploration"]["played"]
    assert result["pairs"]["pairs"] == len(result["pair_list"]) > 0
    assert [e["epoch"] for e in result["epochs"]] == [1, 2] and all(e["pairs"] == result["pairs"]["pairs"]
                                                                   for e in result["epochs"])
    assert result["epochs"][-1]["loss"] < math.log(2)  # the pairs were learnt
    # what is trained is what the model produced: the trainer's log-probs of the played tokens are the engine's
    assert result["engine_vs_trainer_logp_gap"]["max"] < 1e-2
    by_index = {t["index"]: t for t in result["trajectories"]}
    for w, lo in result["pair_list"]:
        assert by_index[w]["verdict"] == "complete" != by_index[lo]["verdict"]
        assert (by_index[w]["scenario"], by_index[w]["task_idx"]) == (by_index[lo]["scenario"], by_index[lo]["task_idx"])
    assert (out / "model" / "tokenizer.json").read_bytes() == (ws / "tokenizer.json").read_bytes()
    assert (out / "awm_runtime.yaml").is_file()
    capsys.readouterr()
    assert awm_eval.main(["--split", str(prompts), "--model", str(out / "model"), "--config",
                          str(out / "awm_runtime.yaml"), "--n", "1"]) == 0
    assert f"over {TASKS} episodes" in capsys.readouterr().out


def test_exploration_drops_infrastructure_failures(ws, tmp_path):
    keys = runtime_config(None, None)
    keys["awm_verifier_timeout"] = 1e-6  # every verifier run times out: an infrastructure failure, not the agent's
    prompts = task_prompts(ws.parent, 1)
    found = explore(ws, prompts, read_prompts(prompts), samples=3, temperature=1.0, seed=0, config=keys)
    assert found.played == 3 and found.infra_failures
    assert len(found.trajectories) + len(found.infra_failures) == 3
    assert not any(t.sample.metadata["awm"]["infra_error"] for t in found.trajectories)
    assert all(f["infra_error"].startswith("verifier") for f in found.infra_failures)


def test_clear_errors(tiny_model_dir, tmp_path):
    prompts = task_prompts(tmp_path, 1)
    with pytest.raises(SystemExit, match="not a Hugging Face model folder"):
        dpo.main(["--model", str(tmp_path / "none"), "--prompts", str(prompts), "--out", str(tmp_path / "o")])
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(SystemExit, match="holds no task"):
        dpo.main(["--model", str(tiny_model_dir), "--prompts", str(empty), "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit, match="does not exist"):
        dpo.main(["--model", str(tiny_model_dir), "--prompts", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path)])
    other = tmp_path / "other.jsonl"  # a split written from another data folder than the one the episodes play
    record = json.loads(prompts.read_text().splitlines()[0])
    record["metadata"]["data_dir"] = str(tmp_path)
    other.write_text(json.dumps(record) + "\n")
    with pytest.raises(SystemExit, match=f"pass --data-dir {tmp_path}"):
        dpo.main(["--model", str(tiny_model_dir), "--prompts", str(other), "--out", str(tmp_path / "o")])
    # the untrained model never solves a task: no pair, and a sentence saying what to do
    with pytest.raises(SystemExit, match="no \\(success, failure\\) pair.*warm start"):
        dpo.main(["--model", str(tiny_model_dir), "--prompts", str(prompts), "--out", str(tmp_path / "o"),
                  "--samples", "2"])


def test_task_subset_is_seeded_and_keeps_file_order(tiny_model_dir, tmp_path):
    from awm_grpo.offline.explore import setup

    prompts = task_prompts(tmp_path, 3)
    names = [json.loads(line)["metadata"]["task_idx"] for line in prompts.read_text().splitlines()]

    def chosen(seed: int, tasks: int) -> list[int]:
        opts = dpo.parse(["--model", str(tiny_model_dir), "--prompts", str(prompts), "--out", str(tmp_path / "o"),
                          "--tasks", str(tasks), "--seed", str(seed)])
        out, records, keys = setup(opts)
        assert (out / "awm_runtime.yaml").is_file() and keys["awm_trace_dir"] is None
        return [r["metadata"]["task_idx"] for r in records]

    picks = {tuple(chosen(seed, 2)) for seed in range(6)}
    assert all(len(p) == 2 and list(p) == [n for n in names if n in p] for p in picks)  # file order
    assert len(picks) > 1 and chosen(4, 2) == chosen(4, 2)  # the seed draws them, the same every time
    assert chosen(0, 0) == names
    with pytest.raises(SystemExit, match="only 3 tasks"):
        chosen(0, 4)
