"""Resume and data at the trust boundary (issue 38): what a killed run, a damaged disk or a plugin leaves
behind is named by file (and line, or sample) and never kills or poisons the next run.

- metrics.jsonl: a non-UTF-8 byte or a damaged middle line is named by file:line, kept out of the
  resumed file and saved beside it; the resumed run goes on.
- trace files: a resumed run never appends to the previous run's `rollout_<step>.jsonl` (its files of
  the repeated steps are moved aside); `traces summary` names a torn or damaged line and goes on.
- checkpoints: damage that keeps every file's framing (bytes changed inside tensor data, an archive
  member or a valid-JSON state file) is found; the run falls back to the newest good iteration and
  the log names the file.
- rewards: NaN, inf, strings, None (and a dict without --reward-key) are errors naming the sample; a
  reward function that never returns fails at --rm-timeout naming the sample and the limit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest
from test_torch_backend import assert_same_params, mixed_samples, params, tiny_model

from awm_grpo import traces
from slime.backends import checkpoint as ckpt
from slime.backends.torch_backend import TorchTrainer, TrainerConfig
from slime.rollout import rm_hub, sglang_rollout
from slime.utils.metrics import MetricsWriter
from slime.utils.types import Sample

REPO = Path(__file__).resolve().parents[2]


# ---- metrics.jsonl ---------------------------------------------------------------------------------


def _metrics_args(tmp_path: Path) -> argparse.Namespace:
    return argparse.Namespace(metrics_path=None, save=str(tmp_path), use_tensorboard=False, tensorboard_dir=None,
                              use_wandb=False)


def _first_run(tmp_path: Path, steps: int = 5) -> Path:
    writer = MetricsWriter(_metrics_args(tmp_path))
    for step in range(steps):
        writer.log(step, {"reward": step})
    writer.close()
    return tmp_path / "metrics.jsonl"


def test_non_utf8_byte_in_metrics_does_not_kill_the_resumed_run(tmp_path, caplog):
    path = _first_run(tmp_path)
    lines = path.read_bytes().splitlines(keepends=True)
    lines[1] = lines[1].replace(b'"train"', b'"tr\xffin"')  # step 1's line: a byte that is not UTF-8
    path.write_bytes(b"".join(lines))
    resumed = MetricsWriter(_metrics_args(tmp_path))
    with caplog.at_level(logging.WARNING, logger="slime.utils.metrics"):
        resumed.log(3, {"reward": 13})  # before: UnicodeDecodeError out of the first log, naming no file
    resumed.close()
    assert f"{path}:2: damaged metrics line (byte 0xff" in caplog.text
    steps = [json.loads(line)["step"] for line in path.read_text().splitlines()]
    assert steps == [0, 2, 3]
    assert (tmp_path / "metrics.jsonl.damaged").read_bytes() == lines[1]  # kept, not lost


def test_damaged_middle_line_is_named_not_dropped_silently(tmp_path, caplog):
    path = _first_run(tmp_path)
    lines = path.read_bytes().splitlines(keepends=True)
    lines[2] = lines[2][:10] + b"\n"  # step 2's line cut short: damaged, in the middle of the file
    lines[3] = b'["not", "an", "object"]\n'
    path.write_bytes(b"".join(lines))
    resumed = MetricsWriter(_metrics_args(tmp_path))
    with caplog.at_level(logging.WARNING, logger="slime.utils.metrics"):
        resumed.log(4, {"reward": 14})
    resumed.close()
    assert f"{path}:3: damaged metrics line (not JSON" in caplog.text
    assert f"{path}:4: damaged metrics line (not a JSON object with an integer 'step')" in caplog.text
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [0, 1, 4]
    assert (tmp_path / "metrics.jsonl.damaged").read_bytes() == lines[2] + lines[3]


# ---- trace files -----------------------------------------------------------------------------------


class _Sample:
    """What `traces._flush` reads of a slime Sample: metadata with the episode record, and the reward."""

    def __init__(self, record: dict, reward: float) -> None:
        self.metadata = {traces.TRACE_KEY: record}
        self.reward = reward

    def get_reward_value(self, args: argparse.Namespace) -> float:
        return self.reward


def _record(scenario: str, step: int, verdict: str = "complete") -> dict:
    return {"kind": "train", "step": step, "scenario": scenario, "task_idx": 0, "task_type": "lookup",
            "verdict": verdict, "turns": [], "infra_error": None}


def _log_steps(trace_dir: Path, steps: range, scenario: str) -> None:
    args = argparse.Namespace(awm_trace_dir=str(trace_dir), awm_max_turns=15)
    for step in steps:
        traces.log_rollout(step, args, [_Sample(_record(scenario, step), 1.0)])


def test_resumed_run_never_appends_to_the_previous_runs_trace_files(tmp_path, monkeypatch, caplog):
    trace_dir = tmp_path / "traces"
    monkeypatch.setattr(traces, "_STARTED", set())  # one process = one run
    _log_steps(trace_dir, range(0, 4), "first_run")
    with open(trace_dir / "rollout_000003.jsonl", "a") as f:
        f.write('{"kind": "train", "step": 3, "scen')  # killed mid-write: a torn last line
    eval_2 = trace_dir / "eval_heldout_000002.jsonl"
    eval_2.write_text(json.dumps(_record("first_run", 2)) + "\n")  # the eval of the checkpoint resumed from
    (trace_dir / "eval_heldout_000003.jsonl").write_text(json.dumps(_record("first_run", 3)) + "\n")

    monkeypatch.setattr(traces, "_STARTED", set())  # the resumed run: a new process, from step 2
    with caplog.at_level(logging.WARNING, logger="awm_grpo"):
        _log_steps(trace_dir, range(2, 5), "resumed_run")
    for step in (2, 3, 4):
        records = [json.loads(line) for line in (trace_dir / f"rollout_{step:06d}.jsonl").read_text().splitlines()]
        assert [r["scenario"] for r in records] == ["resumed_run"], step  # before: first_run's lines, then ours
    for step in (0, 1):
        assert "first_run" in (trace_dir / f"rollout_{step:06d}.jsonl").read_text()
    assert eval_2.exists() and not (trace_dir / "eval_heldout_000003.jsonl").exists()
    moved = sorted(p.name for p in (trace_dir / traces.SUPERSEDED_DIR).rglob("*.jsonl"))
    assert moved == ["eval_heldout_000003.jsonl", "rollout_000002.jsonl", "rollout_000003.jsonl"]
    assert "moved to" in caplog.text and "rollout_000003.jsonl" in caplog.text
    summary = subprocess.run([sys.executable, "-m", "awm_grpo.traces", "summary", str(trace_dir)],
                             capture_output=True, text=True, cwd=REPO, timeout=120)
    assert summary.returncode == 0, summary.stderr
    assert "resumed_run" in summary.stdout and "skipped damaged" not in summary.stderr


def test_traces_summary_names_a_torn_or_damaged_line_and_goes_on(tmp_path):
    trace_dir = tmp_path / "traces"
    trace_dir.mkdir()
    good = json.dumps(_record("shop", 1)) + "\n"
    (trace_dir / "rollout_000001.jsonl").write_bytes(
        good.encode() + b'{"kind": "train", "scen\n' + good.replace("shop", "caf\xe9").encode("latin-1")
        + b"[1, 2]\n" + good.encode() + b'{"kind": "train", "step": 1, "scen')
    summary = subprocess.run([sys.executable, "-m", "awm_grpo.traces", "summary", str(trace_dir)],
                             capture_output=True, text=True, cwd=REPO, timeout=120)
    assert summary.returncode == 0, summary.stderr  # before: a traceback at line 2
    path = trace_dir / "rollout_000001.jsonl"
    for line in (2, 3, 4, 6):
        assert f"{path}:{line}" in summary.stderr, (line, summary.stderr)
    assert "torn" in summary.stderr
    shop = next(row for row in summary.stdout.splitlines() if row.startswith("shop"))
    assert shop.split()[1:3] == ["2", "2"]  # the two good records were counted


# ---- checkpoints -----------------------------------------------------------------------------------


@pytest.fixture
def three_iterations(tmp_path):
    """Iterations 1, 2, 3 of one run under tmp_path; returns the weights after each."""
    trainer = TorchTrainer(tiny_model(), TrainerConfig(lr=1e-2))
    weights = {}
    for iteration in (1, 2, 3):
        trainer.train_step(mixed_samples(), [1.0, -1.0, 1.0, -1.0])
        trainer.save_checkpoint(tmp_path, data_state={"next_rollout_id": iteration})
        weights[iteration] = params(trainer.model)
    return tmp_path, weights


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x5A
    path.write_bytes(bytes(data))


def _member_data_offset(archive: Path) -> int:
    """Where the largest member's bytes start inside a torch zip archive (the framing stays intact)."""
    with zipfile.ZipFile(archive) as z:
        info = max(z.infolist(), key=lambda i: i.compress_size)
    raw = archive.read_bytes()
    name_len, extra_len = int.from_bytes(raw[info.header_offset + 26:info.header_offset + 28], "little"), \
        int.from_bytes(raw[info.header_offset + 28:info.header_offset + 30], "little")
    return info.header_offset + 30 + name_len + extra_len + info.compress_size // 2


def _damage(latest: Path, kind: str) -> Path:
    if kind == "safetensors_data":
        target = next((latest / "model").glob("*.safetensors"))
        _flip(target, target.stat().st_size - 100)  # inside the last tensor: the header still matches the size
    elif kind == "shard_data":
        target = latest / ckpt.TRAINER_DIR / "__0_0.distcp"
        _flip(target, target.stat().st_size // 2)
    elif kind in ("rng_member", "scheduler_member"):
        target = latest / ("rng.pt" if kind == "rng_member" else ckpt.SCHEDULER_FILE)
        _flip(target, _member_data_offset(target))
    else:  # "state_json": still valid JSON, the data position changed
        target = latest / ckpt.STATE_FILE
        payload = json.loads(target.read_text())
        payload["state"]["data_state"] = {"next_rollout_id": 99}
        target.write_text(json.dumps(payload, indent=1))
    return target


@pytest.mark.parametrize("kind", ["safetensors_data", "shard_data", "rng_member", "scheduler_member", "state_json"])
def test_damage_that_keeps_the_framing_falls_back_and_names_the_file(three_iterations, caplog, kind):
    root, weights = three_iterations
    target = _damage(root / "iter_0000003", kind)
    ckpt.check_iteration(root / "iter_0000002")  # the older one passes
    resumed = TorchTrainer(tiny_model(seed=7), TrainerConfig(lr=1e-2))
    with caplog.at_level(logging.WARNING, logger="slime.backends.checkpoint"):
        info = resumed.load_checkpoint(root)
    assert info["iteration"] == 2 and info["data_state"] == {"next_rollout_id": 2}
    assert_same_params(params(resumed.model), weights[2])
    assert str(target) in caplog.text and "resuming from" in caplog.text and "iter_0000002" in caplog.text


def test_state_fields_of_the_wrong_type_are_named(three_iterations):
    """A state file edited by hand (its CRC dropped too): a wrong type is named with its file and field."""
    root, _ = three_iterations
    state = root / "iter_0000003" / ckpt.STATE_FILE
    payload = json.loads(state.read_text())
    payload.pop("state_crc32", None)
    payload["state"]["step"] = "3"
    state.write_text(json.dumps(payload))
    with pytest.raises(ckpt.CheckpointDamaged, match=r"iter_0000003/trainer_state.json: field 'state'"):
        ckpt.check_iteration(root / "iter_0000003")
    assert ckpt.resolve_checkpoint(root).name == "iter_0000002"


def test_a_checkpoint_without_manifest_names_the_file_that_does_not_load(three_iterations):
    """Saved before the manifest existed: a damaged archive member is not found by the framing check, but
    loading it names the file instead of a bare torch error."""
    root, _ = three_iterations
    latest = root / "iter_0000003"
    payload = json.loads((latest / ckpt.STATE_FILE).read_text())
    for key in ("files", "state_crc32"):
        payload.pop(key, None)
    (latest / ckpt.STATE_FILE).write_text(json.dumps(payload))
    target = latest / "rng.pt"
    raw = bytearray(target.read_bytes())
    with zipfile.ZipFile(target) as z:
        info = z.getinfo(next(n for n in z.namelist() if n.endswith("data.pkl")))
    start = info.header_offset + 30 + len(info.filename.encode()) + int.from_bytes(
        raw[info.header_offset + 28:info.header_offset + 30], "little")
    raw[start:start + 2] = b"\xff\xff"  # the pickle's first bytes: framing intact, content broken
    target.write_bytes(bytes(raw))
    assert ckpt.resolve_checkpoint(root).name == "iter_0000003"  # the framing check cannot see it
    resumed = TorchTrainer(tiny_model(seed=7), TrainerConfig(lr=1e-2))
    with pytest.raises(ckpt.CheckpointDamaged, match=r"iter_0000003/rng.pt: does not load"):
        resumed.load_checkpoint(root)


# ---- rewards ---------------------------------------------------------------------------------------

PLUGIN = '''
import asyncio
import threading
import time

RELEASE = threading.Event()


async def reward_value(args, sample):
    return sample.metadata["value"]


async def group_value(args, samples):
    return [s.metadata["value"] for s in samples]


async def never(args, sample):
    await asyncio.Event().wait()


def never_sync(args, sample):
    RELEASE.wait()
    return 1.0


def sync_ok(args, sample):
    return 0.5


async def generate_scored(args, sample, sampling_params):
    sample.response_length = 1
    sample.tokens = [1, 2]
    sample.status = sample.Status.COMPLETED
    sample.reward = sample.metadata["value"]
    return sample
'''


@pytest.fixture()
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    module = f"trust_rm_{tmp_path.name.replace('-', '_')}"  # plugins are loaded once per path
    (tmp_path / f"{module}.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield module
    if module in sys.modules:
        sys.modules[module].RELEASE.set()
        sys.modules.pop(module, None)


def _rm_args(plugin: str, fn: str, **kw) -> argparse.Namespace:
    base = dict(custom_rm_path=f"{plugin}.{fn}", reward_key=None, rm_timeout=600.0, group_rm=False,
                custom_generate_function_path=None, sglang_server_concurrency=4, rollout_engine_urls=["x"])
    return argparse.Namespace(**{**base, **kw})


def _sample(value: object, index: int = 7) -> Sample:
    return Sample(index=index, group_index=3, metadata={"value": value, "scenario": "shop", "task_idx": 2})


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, "1.0", None, [1.0], 10 ** 400],
                         ids=["nan", "inf", "-inf", "str", "None", "list", "int_beyond_float"])
def test_a_reward_that_is_not_a_finite_number_names_the_sample(plugin, value):
    args = _rm_args(plugin, "reward_value")
    with pytest.raises(rm_hub.RewardError, match=r"sample 7 \(group 3 scenario='shop' task_idx=2\)"):
        asyncio.run(rm_hub.async_rm(args, _sample(value)))  # before: returned as the reward


def test_reward_contract_dicts_need_the_key_and_groups_are_checked_per_sample(plugin):
    assert asyncio.run(rm_hub.async_rm(_rm_args(plugin, "reward_value"), _sample(0.25))) == 0.25
    keyed = _rm_args(plugin, "reward_value", reward_key="score")
    assert asyncio.run(rm_hub.async_rm(keyed, _sample({"score": 1, "note": "free"}))) == {"score": 1, "note": "free"}
    with pytest.raises(rm_hub.RewardError, match=r"sample 7 .* --reward-key 'score'"):
        asyncio.run(rm_hub.async_rm(keyed, _sample({"other": 1.0})))
    with pytest.raises(rm_hub.RewardError, match=r"sample 7 .*, its 'score', is nan: a reward must be a finite"):
        asyncio.run(rm_hub.async_rm(keyed, _sample({"score": math.nan})))
    with pytest.raises(rm_hub.RewardError, match=r"sample 7 .*a dict .*pass --reward-key"):
        asyncio.run(rm_hub.async_rm(_rm_args(plugin, "reward_value"), _sample({"score": 1.0})))
    group = [_sample(1.0, 0), _sample(math.nan, 1), _sample(0.0, 2)]
    with pytest.raises(rm_hub.RewardError, match=r"group reward function .* sample 1 \(group 3"):
        asyncio.run(rm_hub.batched_async_rm(_rm_args(plugin, "group_value"), group))


def test_a_reward_set_by_the_generate_function_is_checked_too(plugin, tmp_path):
    from slime.arguments import parse_args

    sglang_rollout.GenerateState.clear_instances()
    args = parse_args(["--hf-checkpoint", str(tmp_path), "--prompt-data", str(tmp_path / "unused.jsonl"),
                       "--rollout-batch-size", "1", "--num-rollout", "1", "--custom-generate-function-path", f"{plugin}.generate_scored",
                       "--custom-rm-path", f"{plugin}.reward_value"])
    try:
        with pytest.raises(rm_hub.RewardError, match=r"sample 7 \(group 3"):
            asyncio.run(sglang_rollout.generate_and_rm(args, _sample(math.nan), {}))
        sglang_rollout.GenerateState.clear_instances()
        assert asyncio.run(sglang_rollout.generate_and_rm(args, _sample(0.5), {})).reward == 0.5
    finally:
        sglang_rollout.GenerateState.clear_instances()


@pytest.mark.parametrize("fn", ["never", "never_sync"])
def test_a_reward_that_never_returns_fails_at_the_timeout_naming_the_sample(plugin, fn):
    args = _rm_args(plugin, fn, rm_timeout=0.5)
    started = time.monotonic()
    with pytest.raises(rm_hub.RewardTimeoutError, match=r"did not return within 0.5 s \(--rm-timeout\) for sample 7"):
        asyncio.run(rm_hub.async_rm(args, _sample(1.0)))  # before: waited forever
    assert time.monotonic() - started < 5
    if fn == "never_sync":
        hung = [t for t in threading.enumerate() if t.name.startswith("reward never_sync")]
        assert hung and all(t.daemon for t in hung)  # cannot block the trainer's exit


def test_a_sync_reward_still_works(plugin):
    assert asyncio.run(rm_hub.async_rm(_rm_args(plugin, "sync_ok"), _sample(None))) == 0.5
