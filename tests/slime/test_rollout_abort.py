"""Over-sampling that stops: once the batch is full the default rollout function aborts what is still in flight
on the engines (sglang's `/abort_request {"abort_all": true}`), cancels and waits for those groups, and
returns only whole groups of whole samples; the aborted prompts go back to the data source.

Real engines over HTTP: the CPU engine (the tiny Qwen3 decoding for real) and the scripted engine
(awm_grpo.loadtest.scripted_engine, replies held for their token count x a per-token latency), real asyncio.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest

from awm_grpo.loadtest.scripted_engine import ScriptedPolicy
from awm_grpo.loadtest.scripted_engine import build_app as scripted_app
from slime.arguments import parse_args
from slime.engine.cpu_server import CPUEngine
from slime.engine.router import BackgroundServer
from slime.models.tiny import build_tiny_model
from slime.rollout import engine_abort
from slime.rollout.data_source import RolloutDataSource, load_prompts
from slime.rollout.sglang_rollout import GenerateState, play_rollout
from slime.utils.http_utils import get, post
from slime.utils.types import Sample

PLUGIN = '''
from slime.rollout import sglang_rollout


async def short_first(args, sample, sampling_params):
    """The real single-turn generate; prompt 0 stops after 2 tokens, every other would decode 4,000."""
    long = sample.metadata["prompt_index"] != 0
    params = dict(sampling_params, ignore_eos=True, max_new_tokens=4000 if long else 2)
    return await sglang_rollout.generate(args, sample, params)


def drop_prompt_one(args, samples, **kwargs):
    return samples[0].metadata["prompt_index"] != 1


async def reward(args, sample):
    return float(sample.index % 2)
'''

# The scripted engine's tasks: prompts 0-2 answer in a few tokens, prompt 3 in about a thousand.
TASKS = {"task zero": "done.", "task one": "done too.", "task two": "also done.",
         "task three": " ".join(f"word{i}" for i in range(400))}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("abort") / "tiny", seed=0)


@pytest.fixture()
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    module = f"abort_plugin_{tmp_path.name.replace('-', '_')}"  # plugins are loaded once per path
    (tmp_path / f"{module}.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield module
    sys.modules.pop(module, None)


def _setup(model_dir: Path, tmp_path: Path, tasks: list[str], *extra: str) -> tuple:
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"input": t}) + "\n" for t in tasks))
    GenerateState.clear_instances()
    args = parse_args(["--hf-checkpoint", str(model_dir), "--prompt-data", str(data), "--num-rollout", "1",
                       "--n-samples-per-prompt", "2", "--rollout-max-response-len", "4096", *extra])
    source = RolloutDataSource(load_prompts(args, data, GenerateState(args).tokenizer), 2, shuffle=False, seed=0)
    return args, source


def _whole(samples: list[list[Sample]], size: int) -> None:
    """Whole groups of whole samples: every sample ended normally, tokens, mask and log-probs agree."""
    for group in samples:
        assert len(group) == size
        for s in group:
            assert s.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED), s.status
            assert s.response_length > 0 and s.reward is not None
            assert len(s.loss_mask) == len(s.rollout_log_probs) == s.response_length
            assert len(s.tokens) > s.response_length


def test_cpu_engine_slots_are_free_when_the_rollout_returns(model_dir, tmp_path, plugin):
    """Batch of 1 group, 4 pulled: prompt 0 fills the batch in 2 tokens while the CPU engine decodes the other
    6 requests (4,000 tokens each). They are aborted: the engine is idle the moment the rollout returns."""
    args, source = _setup(model_dir, tmp_path, [f"prompt {i}" for i in range(6)], "--rollout-batch-size", "1",
                          "--over-sampling-batch-size", "4",
                          "--custom-generate-function-path", f"{plugin}.short_first",
                          "--custom-rm-path", f"{plugin}.reward")
    engine = CPUEngine(str(model_dir), port=0, seed=0)
    args.rollout_engine_urls = [engine.start()]
    try:
        async def step() -> tuple:
            out = await asyncio.wait_for(play_rollout(args, 0, source), timeout=120)
            return out, await get(f"{engine.url}/get_server_info")

        out, info = asyncio.run(step())
    finally:
        engine.shutdown()
    assert (info["num_running_reqs"], info["num_waiting_reqs"]) == (0, 0)  # read once, no waiting
    _whole(out.samples, 2)
    assert [s.response_length for s in out.samples[0]] == [2, 2]
    m = out.metrics
    assert m["rollout/prompt_indices"] == [0]
    assert (m["rollout/episodes_played"], m["rollout/episodes_trained"], m["rollout/episodes_aborted"]) == (2, 2, 6)
    assert m["rollout/played_per_trained"] == 1.0
    assert source.pending == [1, 2, 3]  # the aborted prompts come first next step
    assert [g[0].metadata["prompt_index"] for g in source.get_samples(2)] == [1, 2]


def _scripted_server(model_dir: Path, token_latency_s: float) -> tuple[BackgroundServer, object]:
    from transformers import AutoTokenizer

    scripts = {task: {"reference": [reply], "wrong": []} for task, reply in TASKS.items()}
    app = scripted_app(AutoTokenizer.from_pretrained(model_dir), ScriptedPolicy(scripts, wrong_every=0),
                       token_latency_s=token_latency_s)
    server = BackgroundServer(app)
    server.start()
    return server, app.state.replies


def test_played_and_trained_episodes_on_the_scripted_engine(model_dir, tmp_path, plugin):
    """Batch 2 groups, 4 pulled at once, 20 ms a token: prompts 0-2 finish in well under a second, the filter
    drops prompt 1, prompts 0 and 2 fill the batch; prompt 3 (about 1,000 tokens, 20 s) is aborted mid-reply.
    Played 3 groups x 2 = 6 episodes (the dropped one included), trained 4, aborted 2."""
    args, source = _setup(model_dir, tmp_path, list(TASKS), "--apply-chat-template", "--rollout-batch-size", "2",
                          "--over-sampling-batch-size", "4", "--custom-rm-path", f"{plugin}.reward",
                          "--dynamic-sampling-filter-path", f"{plugin}.drop_prompt_one")
    server, replies = _scripted_server(model_dir, token_latency_s=0.02)
    args.rollout_engine_urls = [server.url]
    try:
        async def step() -> tuple:
            started = time.monotonic()
            out = await asyncio.wait_for(play_rollout(args, 0, source), timeout=60)
            return out, time.monotonic() - started, len(replies.held), await get(f"{server.url}/v1/loads")

        out, wall, held, loads = asyncio.run(step())
    finally:
        server.stop()
    assert held == 0 and loads["loads"][0]["num_running_reqs"] == 0
    assert wall < 10  # the long replies were not waited for
    assert replies.aborted_total == 2
    _whole(out.samples, 2)
    assert all(s.metadata["prompt_index"] in (0, 2) for g in out.samples for s in g)
    m = out.metrics
    assert m["rollout/prompt_indices"] == [0, 2]
    assert (m["rollout/episodes_played"], m["rollout/episodes_trained"], m["rollout/episodes_aborted"]) == (6, 4, 2)
    assert (m["rollout/groups_filtered"], m["rollout/groups_generated"]) == (1, 3)
    assert m["rollout/played_per_trained"] == 1.5 and m["rollout/dynamic_filter/drop_filtered"] == 1
    assert source.pending == [3]


def test_a_small_chunk_replaces_dropped_groups_as_they_finish(model_dir, tmp_path, plugin):
    """Chunks of 1 group for a batch of 2 (no over-sampling): prompts 0 and 1 start; 1 is dropped, which pulls
    prompt 2; nothing is aborted and nothing is played beyond the dropped group."""
    args, source = _setup(model_dir, tmp_path, list(TASKS), "--apply-chat-template", "--rollout-batch-size", "2",
                          "--custom-rm-path", f"{plugin}.reward",
                          "--dynamic-sampling-filter-path", f"{plugin}.drop_prompt_one")
    args.over_sampling_batch_size = 1  # below the batch size: what upstream slime's refill allows
    server, replies = _scripted_server(model_dir, token_latency_s=0.005)
    args.rollout_engine_urls = [server.url]
    try:
        out = asyncio.run(asyncio.wait_for(play_rollout(args, 0, source), timeout=60))
    finally:
        server.stop()
    m = out.metrics
    assert m["rollout/prompt_indices"] == [0, 2]
    assert (m["rollout/episodes_played"], m["rollout/episodes_trained"], m["rollout/episodes_aborted"]) == (6, 4, 0)
    assert replies.aborted_total == 0 and source.pending == []


@pytest.mark.parametrize("policy, started", [("eager", (8, 8)), ("adaptive", (5, 4))])
def test_adaptive_over_sampling_starts_what_the_pass_rate_says_the_batch_lacks(model_dir, tmp_path, plugin, policy,
                                                                             started):
    """Batch 2, chunks of 8, twelve fast prompts, the filter drops prompt 1; two steps. eager (slime's) starts 8
    groups a step. adaptive, step 1 (no pass rate yet: r = 1 - 2 x 0.5^2 = 0.5 for groups of 2): ceil(2 / 0.5) + 1
    = 5 groups; step 2 (r = 2/3, 3/4 or 4/5 from step 1's 3-5 finished groups, one dropped): ceil(2 / r) + 1 = 4
    groups, the first two to finish make the batch."""
    args, source = _setup(model_dir, tmp_path, ["task zero"] * 12, "--apply-chat-template", "--rollout-batch-size",
                          "2", "--over-sampling-batch-size", "8", "--over-sampling-policy", policy,
                          "--custom-rm-path", f"{plugin}.reward",
                          "--dynamic-sampling-filter-path", f"{plugin}.drop_prompt_one")
    server, replies = _scripted_server(model_dir, token_latency_s=0.005)
    args.rollout_engine_urls = [server.url]

    async def steps() -> list:
        return [await play_rollout(args, step, source) for step in (0, 1)]

    try:
        first, second = asyncio.run(asyncio.wait_for(steps(), timeout=60))
    finally:
        server.stop()
    for out, n in zip((first, second), started, strict=True):
        m = out.metrics
        _whole(out.samples, 2)
        assert m["rollout/episodes_played"] + m["rollout/episodes_aborted"] == 2 * n  # every group started
        assert m["rollout/episodes_trained"] == 4
    assert first.metrics["rollout/groups_filtered"] == 1 and first.metrics["rollout/prompt_indices"][0] == 0
    assert first.metrics["rollout/prompt_indices"][1] in range(2, started[0])


# ---- the scripted engine's abort, pause and per-token latency over HTTP ---------------------------------------


def _prompt(model_dir: Path, task: str) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    text = tok.apply_chat_template([{"role": "user", "content": task}], tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False)["input_ids"]


def test_scripted_engine_abort_by_rid_and_all_and_pause(model_dir):
    server, replies = _scripted_server(model_dir, token_latency_s=0.005)
    prompts = {task: _prompt(model_dir, task) for task in ("task zero", "task three")}

    async def generate(task: str, rid: str | None = None) -> tuple[dict, float]:
        started = time.monotonic()
        body = {"input_ids": prompts[task], "sampling_params": {"max_new_tokens": 4096}, **({"rid": rid} if rid else {})}
        return await post(f"{server.url}/generate", body), time.monotonic() - started

    async def scenario() -> dict:
        full, full_s = await generate("task three")
        long_a = asyncio.create_task(generate("task three", rid="a"))
        long_b = asyncio.create_task(generate("task three", rid="b"))
        await asyncio.sleep(0.5)
        await post(f"{server.url}/abort_request", {"rid": "a"})
        a, a_s = await long_a
        assert not long_b.done()
        await post(f"{server.url}/abort_request", {"abort_all": True})
        b, b_s = await long_b
        await post(f"{server.url}/pause_generation", {})
        short = asyncio.create_task(generate("task zero"))
        await asyncio.sleep(0.5)
        paused_done = short.done()
        flush_while_held = (await asyncio.to_thread(_status, f"{server.url}/flush_cache"))
        await post(f"{server.url}/continue_generation", {})
        reply, _ = await short
        return {"full": full, "full_s": full_s, "a": a, "a_s": a_s, "b": b, "b_s": b_s, "paused_done": paused_done,
                "flush": flush_while_held, "short": reply}

    try:
        r = asyncio.run(scenario())
    finally:
        server.stop()
    n_full = len(r["full"]["meta_info"]["output_token_logprobs"])
    assert n_full > 500 and r["full_s"] >= n_full * 0.005  # held for its token count x 5 ms
    for key in ("a", "b"):
        meta = r[key]["meta_info"]
        assert meta["finish_reason"]["type"] == "abort"
        tokens = [t for _, t, _ in meta["output_token_logprobs"]]
        assert 0 < len(tokens) < n_full and tokens == [t for _, t, _ in r["full"]["meta_info"]["output_token_logprobs"]][
            : len(tokens)]  # the tokens so far, a prefix of the whole reply
        assert r[f"{key}_s"] < r["full_s"] - 1.0
    assert r["paused_done"] is False and r["flush"] == 503
    assert r["short"]["meta_info"]["finish_reason"]["type"] == "stop"
    assert not replies.held


def _status(url: str) -> int:
    import httpx

    return httpx.get(url, timeout=5).status_code


def test_scripted_engine_holds_nothing_by_default(model_dir):
    """Without latencies a reply is immediate and never held (the engine's behaviour before per-token latency)."""
    server, replies = _scripted_server(model_dir, token_latency_s=0.0)
    body = {"input_ids": _prompt(model_dir, "task three"), "sampling_params": {"max_new_tokens": 4096}}
    try:
        started = time.monotonic()
        reply = asyncio.run(post(f"{server.url}/generate", body))
        seconds = time.monotonic() - started
    finally:
        server.stop()
    assert reply["meta_info"]["finish_reason"]["type"] == "stop" and seconds < 2.0
    assert replies.aborted_total == 0 and not replies.held


# ---- sglang's own code: the abort body, the load route, the scripted engine's routes ----------------------------


# sglang's own /v1/loads handler (its sub-router, which the oracle's route table does not list) answering for
# two DP ranks with sglang's own load structs: 3 running + 2 waiting, and 1 running.
LOADS_PROBE = """
import asyncio, dataclasses, json, sys

import sglang.srt.entrypoints.v1_loads as v1_loads

try:
    from sglang.srt.managers.load_snapshot import LoadSnapshot as Load  # 0.5.23
    loads = [Load(dp_rank=0, num_running_reqs=3, num_waiting_reqs=2), Load(dp_rank=1, num_running_reqs=1)]
except ImportError:
    from sglang.srt.managers.io_struct import GetLoadsReqOutput as Load  # 0.5.10
    required = [f.name for f in dataclasses.fields(Load)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    def make(**kw):
        return Load(**{**{name: 0 for name in required}, **kw})
    loads = [make(dp_rank=0, num_running_reqs=3, num_waiting_reqs=2), make(dp_rank=1, num_running_reqs=1)]


# 0.5.23 adds the accelerator's name and count per DP rank, read from a running server's config: hardware
# probes, answered here in the server's place (the `loads` list is sglang's own code).
for probe, answer in (("_accelerator_name", "cpu"), ("_num_accelerators_per_dp_rank", 1)):
    if hasattr(v1_loads, probe):
        setattr(v1_loads, probe, lambda answer=answer: answer)


class TokenizerManager:
    async def get_loads(self, include=None, dp_rank=None):
        return loads


assert any(r.path == "/v1/loads" and "GET" in r.methods for r in v1_loads.router.routes)
reply = asyncio.run(v1_loads.get_loads(dp_rank=None, include=None, format=None, tokenizer_manager=TokenizerManager()))
print(json.dumps(reply, default=str))
"""


def test_abort_body_and_load_reply_are_sglangs(sglang) -> None:
    import subprocess

    from sglang_real import sglang_env

    assert sglang.check_request("POST", "/abort_request", engine_abort.ABORT_ALL) == []
    run = subprocess.run([sys.executable, "-c", LOADS_PROBE], env=sglang_env(sglang.gpu_set), capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    reply = json.loads(run.stdout.strip().splitlines()[-1])
    assert engine_abort.requests_in(reply, engine_abort.LOADS_PATH) == 6
    assert engine_abort.requests_in({"model_path": "m", "internal_states": []}, "/get_server_info") is None


def test_scripted_engine_serves_only_what_stock_sglang_serves(sglang, model_dir) -> None:
    from transformers import AutoTokenizer

    app = scripted_app(AutoTokenizer.from_pretrained(model_dir), ScriptedPolicy({}))
    served = sglang.routes()
    ours = {(m, r.path) for r in app.routes if hasattr(r, "methods") and r.path not in (
        "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc") for m in r.methods - {"HEAD"}}
    served.setdefault(engine_abort.LOADS_PATH, ["GET"])  # an included router: checked by the test above
    assert sorted(f"{m} {p}" for m, p in ours if m not in served.get(p, [])) == []


def test_scripted_policy_can_fix_the_wrong_episodes_by_seed() -> None:
    """`wrong_by_seed`: an episode plays the wrong solution when its first request's sampling_seed is a multiple of
    `wrong_every`, whatever the arrival order (runs compare); the default counts arrivals, as before."""
    conversation = "<|im_start|>user\nt<|im_end|>\n<|im_start|>assistant\n"
    scripts = {"t": {"reference": ["right"], "wrong": ["wrong"]}}
    by_seed = ScriptedPolicy(scripts, wrong_every=4, wrong_by_seed=True)
    assert [by_seed.reply(conversation, seed) for seed in (9, 8, 9, 12)] == ["right", "wrong", "right", "wrong"]
    with pytest.raises(ValueError, match="sampling_seed"):
        by_seed.reply(conversation)
    by_arrival = ScriptedPolicy(scripts, wrong_every=4)
    assert [by_arrival.reply(conversation, 8) for _ in range(4)] == ["right", "right", "right", "wrong"]
