"""End-to-end tests of `python -m slime.train` on the toy task: a real local Ray cluster, one CPU
engine, the tiny offline Qwen3. Each run is a subprocess, as a user would start it."""

from __future__ import annotations

import json
import math
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slime.arguments import ArgumentError, parse_args
from slime.models.tiny import build_tiny_model
from slime.rollout import Prompt, PromptDataSource, check_reward_nonzero_std
from slime.train import build_train_batch
from slime.utils.metrics import _masked_crc
from slime.utils.types import Sample

REPO = Path(__file__).resolve().parents[2]
TOY = REPO / "examples" / "toy_single_turn"
sys.path.insert(0, str(TOY))
from make_data import rows  # noqa: E402
from reward import score  # noqa: E402


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """Tiny model + train/eval prompt files, shared by the module's runs."""
    root = tmp_path_factory.mktemp("toy")
    build_tiny_model(root / "model")
    for name, count, offset in (("train.jsonl", 16, 0), ("eval.jsonl", 4, 100)):
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in rows(count, offset)))
    return root


def _command(toy: Path, work: Path, *extra: str, steps: int = 3) -> list[str]:
    return [
        sys.executable, "-m", "slime.train",
        "--hf-checkpoint", str(toy / "model"), "--prompt-data", str(toy / "train.jsonl"),
        "--label-key", "label", "--apply-chat-template",
        "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--num-rollout", str(steps),
        "--rollout-max-response-len", "6", "--custom-rm-path", "reward.reward", "--lr", "5e-3",
        "--save", str(work / "ckpt"), "--load", str(work / "ckpt"), "--ray-num-cpus", "4",
        *extra,
    ]


def _env(*paths: Path) -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", RAY_AUTH_MODE="disabled", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join([str(TOY), *map(str, paths), str(REPO), env.get("PYTHONPATH", "")])
    return env


def _run(cmd: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        _kill_group(proc)
    assert proc.returncode == 0, out[-4000:]
    return subprocess.CompletedProcess(cmd, proc.returncode, out)


def _kill_group(proc: subprocess.Popen) -> None:
    """Remove whatever the run left in its session (a SIGKILLed driver leaves Ray's processes)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _train_records(work: Path) -> dict[int, dict]:
    """The last train record of each step (a killed run may have logged a step it never saved)."""
    records = {}
    for line in (work / "ckpt" / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["kind"] == "train":
            records[record["step"]] = record
    return records


def _assert_logprob_gate(record: dict) -> None:
    assert record["train/train_rollout_logprob_abs_diff"] < 1e-5
    assert record["train/train_rollout_logprob_abs_diff_max"] < 1e-5


def _read_tfrecords(path: Path) -> list[bytes]:
    data, events, pos = path.read_bytes(), [], 0
    while pos < len(data):
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        assert struct.unpack("<I", data[pos + 8:pos + 12])[0] == _masked_crc(header)
        event = data[pos + 12:pos + 12 + length]
        assert struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])[0] == _masked_crc(event)
        events.append(event)
        pos += 16 + length
    return events


# ---- fast, in-process -----------------------------------------------------------------------------


def test_data_source_resumes_the_same_order():
    prompts = [Prompt(i, f"p{i}", [i + 1], None, {}) for i in range(5)]
    straight = PromptDataSource(prompts, 2, shuffle=True, seed=7)
    first = [g[0].metadata["prompt_index"] for g in straight.get_samples(3)]
    state = straight.state()
    expected = [g[0].metadata["prompt_index"] for g in straight.get_samples(6)]
    resumed = PromptDataSource(prompts, 2, shuffle=True, seed=7)
    resumed.load_state(json.loads(json.dumps(state)))
    assert [g[0].metadata["prompt_index"] for g in resumed.get_samples(6)] == expected
    assert sorted(first + expected[:2]) == [0, 1, 2, 3, 4]  # epoch 0 visits every prompt once
    assert [s.index for g in resumed.get_samples(1) for s in g] == [18, 19]


def test_grpo_batch_and_filter(tmp_path):
    args = parse_args(["--hf-checkpoint", "m", "--prompt-data", "p", "--rollout-batch-size", "1",
                       "--n-samples-per-prompt", "2", "--num-rollout", "1"])
    group = [Sample(group_index=0, index=i, tokens=[1, 2], response_length=1, reward=r) for i, r in enumerate((1.0, 0.0))]
    samples, adv = build_train_batch(args, [group])
    # mean 0.5, Bessel std sqrt(0.5): (1 - 0.5) / 0.7071 = 0.7071
    assert adv == pytest.approx([0.70710, -0.70710], abs=1e-4)
    assert check_reward_nonzero_std(args, group).keep
    assert check_reward_nonzero_std(args, [group[0], group[0]]).reason == "zero_std_1.0"
    assert score("<|im_end|>77a", "7") == pytest.approx(0.5 * 2 / 3 + 0.5 * 2 / 3)


def test_custom_config_yaml_becomes_args(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("max_turns: 7\nenv_url: http://x\n")
    args = parse_args(["--hf-checkpoint", "m", "--prompt-data", "p", "--rollout-batch-size", "1",
                       "--num-rollout", "1", "--custom-config-path", str(config)])
    assert (args.max_turns, args.env_url, args.over_sampling_batch_size) == (7, "http://x", 1)


def test_colocate_implies_the_memory_hand_over_on_gpu_engines_only():
    base = ["--hf-checkpoint", "m", "--prompt-data", "p", "--rollout-batch-size", "1", "--num-rollout", "1"]

    def offloads(*extra: str) -> tuple[bool, bool]:
        args = parse_args([*base, *extra])
        return args.offload_train, args.offload_rollout

    assert offloads() == (False, False)
    assert offloads("--colocate") == (False, False)  # CPU engines share host memory, not a GPU
    assert offloads("--colocate", "--engine-type", "sglang") == (True, True)  # slime's default
    assert offloads("--colocate", "--engine-type", "sglang", "--no-offload-train") == (False, True)
    assert offloads("--offload") == (True, True)
    with pytest.raises(ArgumentError, match="update-weights-interval 1"):
        parse_args([*base, "--offload-rollout", "--update-weights-interval", "2"])


# ---- end to end ----------------------------------------------------------------------------------


def test_three_steps_write_checkpoints_and_metrics(toy, tmp_path):
    """Saving every step with --keep-checkpoints 2: the newest two saves stay, with their data positions."""
    _run(_command(toy, tmp_path, "--save-interval", "1", "--keep-checkpoints", "2", "--use-tensorboard",
                  "--eval-prompt-data", "toy", str(toy / "eval.jsonl"), "--eval-interval", "2"), _env())
    ckpt = tmp_path / "ckpt"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    assert sorted(p.name for p in ckpt.glob("iter_*")) == ["iter_0000001", "iter_0000002"]
    assert sorted(p.name for p in (ckpt / "rollout").iterdir()) == ["global_dataset_state_dict_1.pt",
                                                                    "global_dataset_state_dict_2.pt"]
    for it in (1, 2):
        assert (ckpt / f"iter_{it:07d}" / "model" / "model.safetensors").is_file()
        assert (ckpt / f"iter_{it:07d}" / "trainer" / ".metadata").is_file()
    records = _train_records(tmp_path)
    assert sorted(records) == [0, 1, 2]
    for record in records.values():
        numbers = [v for v in record.values() if isinstance(v, float)]
        assert numbers and all(math.isfinite(v) for v in numbers)
        assert 0.0 <= record["rollout/raw_reward"] <= 1.0
    _assert_logprob_gate(records[0])  # correctness gate at temperature 1.0, through the loop's data
    evals = [json.loads(line) for line in (ckpt / "metrics.jsonl").read_text().splitlines() if '"eval"' in line]
    assert [e["step"] for e in evals] == [0, 2]
    (events,) = (ckpt / "tensorboard").glob("events.out.tfevents.*")
    assert len(_read_tfrecords(events)) == 1 + 2 + 3  # file version, 2 evals, 3 steps
    assert b"rollout/raw_reward" in events.read_bytes()


def test_logprob_gate_at_another_temperature(toy, tmp_path):
    _run(_command(toy, tmp_path, "--rollout-temperature", "0.6", "--ci-test",
                  "--ci-train-rollout-logprob-abs-diff-threshold", "1e-5", steps=2), _env())
    records = _train_records(tmp_path)
    _assert_logprob_gate(records[0])
    _assert_logprob_gate(records[1])  # after a weight sync the engine still matches the trainer


def test_memory_hand_over_keeps_the_engines_on_the_trainers_weights(toy, tmp_path):
    """--offload: every step the engines release their weights (uninitialised when resumed) and the
    trainer offloads; the log-prob gate after each hand-over shows the engines serve the trainer's
    weights again (a resume without the weight sync would fail it, a missing resume would 503)."""
    _run(_command(toy, tmp_path, "--offload", "--eval-prompt-data", "toy", str(toy / "eval.jsonl"),
                  "--eval-interval", "3"), _env())
    records = _train_records(tmp_path)
    assert sorted(records) == [0, 1, 2]
    for step in (1, 2):
        _assert_logprob_gate(records[step])
    evals = [json.loads(line) for line in (tmp_path / "ckpt" / "metrics.jsonl").read_text().splitlines()
             if '"eval"' in line]
    assert [e["step"] for e in evals] == [0, 3]


def test_sigkill_driver_then_rerun_resumes_with_same_data_order(toy, tmp_path):
    extra = ("--rollout-shuffle", "--save-interval", "1")
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    _run(_command(toy, straight, *extra, steps=6), _env())

    cmd = _command(toy, killed, *extra, steps=6)
    proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    latest = killed / "ckpt" / "latest_checkpointed_iteration.txt"
    deadline = time.monotonic() + 90
    while not (latest.is_file() and int(latest.read_text() or -1) >= 1):
        assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint for step 1"
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    _kill_group(proc)
    saved = int(latest.read_text())
    assert saved < 5, "the driver finished before it could be killed"

    out = _run(cmd, _env()).stdout
    assert f"resumed from {killed / 'ckpt' / f'iter_{saved:07d}'}: next step {saved + 1}" in out
    want, got = _train_records(straight), _train_records(killed)
    assert sorted(got) == list(range(6))
    for step in range(6):
        assert got[step]["rollout/prompt_indices"] == want[step]["rollout/prompt_indices"], step


CRASH_PLUGIN = '''
import os, signal
from pathlib import Path
from slime.rollout import generate as default_generate

async def generate(args, sample, sampling_params):
    """Kill the engine once, at the first sample of step 1, then generate as usual."""
    marker = Path(args.crash_marker)
    if sample.index >= 16 and not marker.exists():
        marker.write_text(str(args.rollout_engine_pids[0]))
        os.kill(args.rollout_engine_pids[0], signal.SIGKILL)
    return await default_generate(args, sample, sampling_params)
'''


def test_killed_engine_is_restarted_and_the_step_completes(toy, tmp_path):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "crash_plugin.py").write_text(CRASH_PLUGIN)
    config = tmp_path / "config.yaml"
    config.write_text(f"crash_marker: {tmp_path / 'killed_pid'}\n")
    out = _run(_command(toy, tmp_path, "--custom-generate-function-path", "crash_plugin.generate",
                        "--custom-config-path", str(config), "--rollout-health-check-interval", "1"),
               _env(plugins)).stdout
    assert (tmp_path / "killed_pid").is_file()
    assert "restarting it with weights 1" in out
    records = _train_records(tmp_path)
    assert sorted(records) == [0, 1, 2]
    # The engine dies during step 1's rollout, so its restart is counted in step 1, wherever it was
    # noticed (a failed request or the watchdog: the step waits for the watchdog's restart to finish).
    assert [records[s]["rollout/engine_restarts"] for s in range(3)] == [0.0, 1.0, 0.0]
    # The restarted engine serves the current weights: its log-probs still match the trainer's.
    _assert_logprob_gate(records[1])
    _assert_logprob_gate(records[2])


@pytest.mark.slow
def test_toy_reward_rises(tmp_path):
    """The README's toy run (examples/toy_single_turn/run.sh): 20 steps, the reward must rise."""
    started = time.monotonic()
    out = subprocess.run(["bash", str(TOY / "run.sh"), str(tmp_path)], cwd=REPO, env=_env(),
                         capture_output=True, text=True, timeout=600, start_new_session=True)
    assert out.returncode == 0, out.stderr[-4000:]
    records = _train_records(tmp_path)
    curve = [records[s]["rollout/raw_reward"] for s in range(20)]
    print("reward curve:", " ".join(f"{r:.3f}" for r in curve), f"({time.monotonic() - started:.0f} s)")
    assert sum(curve[-5:]) / 5 > sum(curve[:5]) / 5 + 0.1
