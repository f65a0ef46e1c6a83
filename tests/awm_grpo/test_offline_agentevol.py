"""awm_grpo.offline.agentevol: the filter, and the command end to end (real tiny model, CPU engine, bundled
scenarios): each iteration explores with the previous policy, fine-tunes the START on D_s + what the verifier
accepted, and the saved model loads in awm_grpo.eval."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from offline_helpers import TASKS, task_prompts, warm_start
from safetensors.torch import load_file

from awm_grpo import eval as awm_eval
from awm_grpo.offline import agentevol
from awm_grpo.offline.explore import (
    Exploration,
    Trajectory,
    explore,
    load_model,
    read_prompts,
    runtime_config,
)
from awm_grpo.warmstart.sft import Episodes, sft
from slime.utils.types import Sample


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    torch.set_num_threads(1)
    return warm_start(tmp_path_factory.mktemp("offline-agentevol"), tiny_model_dir)


def _traj(index: int, task: int, success: bool) -> Trajectory:
    sample = Sample(index=index, tokens=[1, 2], response_length=1, loss_mask=[1])
    return Trajectory(sample=sample, scenario="s", task_idx=task, verdict="complete" if success else "others",
                      reward=float(success), stop_reason="final_answer", turns=1)


def test_filter_keeps_verified_successes_up_to_k_per_task_in_play_order():
    found = Exploration(trajectories=[_traj(0, 0, False), _traj(1, 0, True), _traj(2, 0, True), _traj(3, 1, False),
                                      _traj(4, 2, True)], played=5)
    assert [t.sample.index for t in agentevol.accepted(found, 1)] == [1, 4]
    assert [t.sample.index for t in agentevol.accepted(found, 2)] == [1, 2, 4]


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def test_agentevol_end_to_end_trains_the_start_each_iteration(ws, tmp_path, capsys):
    prompts = task_prompts(ws.parent)
    out = tmp_path / "ae"
    assert agentevol.main(["--model", str(ws), "--prompts", str(prompts), "--out", str(out), "--iterations", "2",
                           "--samples", "3", "--epochs", "2", "--seed", "5"]) == 0
    result = json.loads((out / "agentevol.json").read_text())
    assert result["reference_episodes"] == TASKS and result["episodes_played"] == 2 * TASKS * 3
    its = result["iterations"]
    assert [it["explored_with"] for it in its] == ["start", "iter_1"]
    for it in its:
        successes = it["exploration"]["successes"]
        assert it["episodes"] == TASKS * 3 and it["accepted"] == it["accepted_tasks"] <= min(successes, TASKS)
        assert it["train_episodes"] == TASKS + it["accepted"] and len(it["losses"]) == 2
    assert sum(it["accepted"] for it in its) > 0  # the warm start solves some tasks: something was accepted
    final = _weights(out / "model")
    assert all(torch.equal(final[k], v) for k, v in _weights(out / "iter_2" / "model").items())

    # Iteration 2 by hand: iteration 1's policy explores (seed + 1000), its accepted episodes join D_s, and the
    # START is fine-tuned on them (seed + 2): the same weights, so it trained from the start, not from iter_1.
    keys = runtime_config(None, None)
    found = explore(out / "iter_1" / "model", prompts, read_prompts(prompts), samples=3, temperature=1.0,
                    seed=5 + 1000, config=keys)
    assert found.summary()["successes"] == its[1]["exploration"]["successes"]
    reference, dropped = agentevol.reference_episodes(str(ws), str(prompts), read_prompts(prompts), keys, 2048, 5)
    assert dropped == 0
    data = Episodes(None, 0, 2048)
    data.real = reference + [t.sample for t in agentevol.accepted(found, 1)]
    torch.set_num_threads(1)
    model = load_model(ws)
    sft(model, data, epochs=2, lr=agentevol.DEFAULT_LR, seed=5 + 2)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in final.items() if k in model.state_dict())

    assert (out / "model" / "tokenizer.json").read_bytes() == (ws / "tokenizer.json").read_bytes()
    capsys.readouterr()
    assert awm_eval.main(["--split", str(prompts), "--model", str(out / "model"), "--config",
                          str(out / "awm_runtime.yaml"), "--n", "1"]) == 0
    assert f"over {TASKS} episodes" in capsys.readouterr().out


def test_nothing_to_train_on_is_a_clear_error(tiny_model_dir, tmp_path):
    prompts = task_prompts(tmp_path, 1)
    with pytest.raises(SystemExit, match="accepted no episode.*warm start"):
        agentevol.main(["--model", str(tiny_model_dir), "--prompts", str(prompts), "--out", str(tmp_path / "o"),
                        "--samples", "2", "--no-reference"])
    other = tmp_path / "other"
    shutil.copytree(tiny_model_dir, other)
    (other / "tokenizer.json").write_text((other / "tokenizer.json").read_text().replace("<|im_end|>", "<|im_stop|>"))
    with pytest.raises(SystemExit, match="another tokenizer"):
        agentevol.main(["--model", str(tiny_model_dir), "--prompts", str(prompts), "--out", str(tmp_path / "o"),
                        "--train-from", str(other)])
    with pytest.raises(SystemExit, match="--iterations 0: use >= 1"):
        agentevol.main(["--model", str(tiny_model_dir), "--prompts", str(prompts), "--out", str(tmp_path / "o"),
                        "--iterations", "0"])
