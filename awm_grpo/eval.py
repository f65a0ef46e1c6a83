"""Evaluate a policy on a split: a checkpoint, a running engine, or any OpenAI-compatible endpoint.

    python -m awm_grpo.eval --split runs/awm_grpo/splits/test.jsonl --model runs/awm_grpo/weights/...
    python -m awm_grpo.eval --split ... --engine-url http://127.0.0.1:30000 --model TOKENIZER_DIR
    python -m awm_grpo.eval --split ... --openai-base-url http://127.0.0.1:8000/v1 --openai-model Qwen3-4B

With a checkpoint, a CPU engine (slime.engine.cpu_server) serves it in this process and the episodes
run through the training rollout itself (token-in/token-out, same prompts, same stop conditions).
`--engine-url` uses an already running SGLang-protocol server instead. An OpenAI-compatible
endpoint gets chat messages (tool results as `role: tool` messages) and the same protocol and stop
conditions (`awm_grpo.rollout.model_turn`). Prints success by scenario and task type and writes the
traces (`--out`, JSONL) for `python -m awm_grpo.traces summary`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tqdm import tqdm

from awm_grpo import protocol, traces
from awm_grpo.env_client import EnvInfraError
from awm_grpo.rollout import Episode, RolloutConfig, ToolRunner, generate, model_turn, open_episode, verify
from slime.arguments import parse_args
from slime.rollout.sglang_rollout import GenerateState, sampling_params_from_args
from slime.utils.types import Sample


async def play_chat(cfg: RolloutConfig, client: Any, record: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """One episode against a chat endpoint; returns its trace record."""
    meta = record["metadata"]
    episode = Episode(meta["scenario"], int(meta["task_idx"]), meta.get("task", ""))
    system = protocol.NATIVE_SYSTEM_PROMPT if cfg.tool_mode == "native" else protocol.META_SYSTEM_PROMPT
    env = None
    try:
        env = await open_episode(cfg.env, episode)  # AgentGym rows: sets the task from the first observation
        tools = protocol.native_tool_schemas(env.tools if cfg.tool_mode == "native" else protocol.META_TOOLS)
        if cfg.tool_mode == "meta":
            system += "\n\nTools:\n" + json.dumps(tools)
        history: list[dict[str, Any]] = [{"role": "system", "content": system},
                                         {"role": "user", "content": episode.task}]
        episode.messages = history[1:]
        turns = ToolRunner(cfg, env, episode)
        while True:
            reply = await client.chat(history, **params)
            stop, texts = await model_turn(cfg, turns, reply.text, reply.finish_reason, reply.usage.get(
                "completion_tokens", 0), step=0)
            history.append({"role": "assistant", "content": reply.text})
            if stop is not None:
                break
            history += [{"role": "tool", "content": t} for t in texts]
            episode.messages = history[1:]
        await verify(cfg, env, episode)
    except EnvInfraError as exc:
        episode.infra_error = str(exc)
    finally:
        if env is not None:
            await env.close()
    return {"scenario": episode.scenario, "task_idx": episode.task_idx, "task": episode.task,
            "task_type": meta.get("task_type"), "verdict": episode.verdict, "stop_reason": episode.stop_reason,
            "infra_error": episode.infra_error, "turns": episode.turns, "final_answer": episode.final_answer,
            "invalid_calls": episode.invalid_calls, "tool_calls": episode.tool_calls}


async def play_records(args: argparse.Namespace, records: list[dict[str, Any]], n: int, concurrency: int,
                       evaluation: bool = True, desc: str = "episodes") -> list[Sample]:
    """n episodes of every prompt record through the training rollout (`awm_grpo.rollout.generate`), at
    most `concurrency` at once; sample i is record i // n's (i % n)-th episode, in that order.

    `evaluation`: the eval sampling params (`--eval-*`) and turn seeds, else the rollout's (`--rollout-*`),
    as a training step samples (awm_grpo.offline explores so). Each sample keeps its trace record under
    `metadata[traces.TRACE_KEY]`."""
    limit = asyncio.Semaphore(concurrency)
    params = sampling_params_from_args(args, evaluation=evaluation)
    bar = tqdm(total=len(records) * n, desc=desc, file=sys.stderr)

    async def one(i: int, record: dict[str, Any]) -> Sample:
        sample = Sample(index=i, group_index=i // n, prompt=record["text"], metadata=dict(record["metadata"]))
        async with limit:
            out = await generate(args, sample, dict(params), evaluation=evaluation)
        bar.update()
        if isinstance(out, list):  # B1's windowed turns come back as samples of their own
            raise ValueError("awm_history_window_turns splits an episode into several samples: play it with the "
                             "training rollout (slime.train), not here")
        return out

    try:
        return list(await asyncio.gather(*(one(i, r) for i, r in enumerate(r for r in records for _ in range(n)))))
    finally:
        bar.close()


async def _run_engine(args: argparse.Namespace, records: list[dict[str, Any]], n: int, concurrency: int) -> list[dict]:
    return [s.metadata.pop(traces.TRACE_KEY) for s in await play_records(args, records, n, concurrency)]


async def _run_chat(cfg: RolloutConfig, opts: argparse.Namespace, records: list[dict[str, Any]]) -> list[dict]:
    from awm.llm import ChatClient

    client = ChatClient(opts.openai_base_url, model=opts.openai_model, max_concurrency=opts.concurrency)
    params = {"temperature": opts.temperature, "max_tokens": opts.max_tokens_per_turn}
    bar = tqdm(total=len(records) * opts.n, desc="episodes", file=sys.stderr)

    async def one(record: dict[str, Any]) -> dict[str, Any]:
        result = await play_chat(cfg, client, record, params)
        bar.update()
        return result

    try:
        return list(await asyncio.gather(*(one(r) for r in records for _ in range(opts.n))))
    finally:
        bar.close()
        await client.aclose()


def success_rate(records: list[dict[str, Any]]) -> float:
    valid = [r for r in records if not r.get("infra_error")]
    return sum(r.get("verdict") == "complete" for r in valid) / len(valid) if valid else float("nan")


@contextlib.contextmanager
def policy_runtime(model: str | None, prompts: str, *, config: dict[str, Any] | None = None, seed: int = 0,
                   temperature: float = 0.0, rollout_temperature: float | None = None, max_response_len: int = 4096,
                   engine_url: str | None = None, serve: bool = True) -> Iterator[argparse.Namespace]:
    """The rollout's args for playing `model` on the prompt file `prompts`, while the block runs.

    With `serve` and no `engine_url`, a CPU engine (slime.engine.cpu_server) serves the checkpoint in this
    process (seeded with `seed`) and is shut down on exit; the environment runtimes are closed on exit.
    `temperature` is the eval temperature, `rollout_temperature` the rollout's (slime's default when None;
    `play_records(evaluation=...)` picks one), `seed` the rollout seed (turn seeds); `config` holds the runtime
    YAML's awm_* keys. Shared by awm_grpo.eval and awm_grpo.offline, so evaluation and offline exploration
    play alike."""
    flags = ["--hf-checkpoint", model or "unused", "--prompt-data", prompts, "--rollout-batch-size", "1",
             "--num-rollout", "1", "--rollout-max-response-len", str(max_response_len),
             "--eval-temperature", str(temperature), "--rollout-seed", str(seed)]
    if rollout_temperature is not None:
        flags += ["--rollout-temperature", str(rollout_temperature)]
    engine = None
    try:
        if serve:
            if not model:
                raise SystemExit("--model is required with a checkpoint or --engine-url (its tokenizer is used)")
            url = engine_url
            if url is None:
                from slime.engine.cpu_server import CPUEngine

                engine = CPUEngine(model, port=0, seed=seed)
                url = engine.start()
            host, port = url.removeprefix("http://").rsplit(":", 1)
            flags += ["--sglang-router-ip", host, "--sglang-router-port", port]
        args = parse_args(flags)
        for key, value in (config or {}).items():
            setattr(args, key, value)
        if (config or {}).get("awm_history_window_turns") is not None:
            args.calculate_per_token_loss = True  # as the windowed run trained (rollout's check); no loss here
        args.awm_trace_dir = None
        RolloutConfig.from_args(args)  # a bad awm_* key fails here, before any episode
        GenerateState.clear_instances()
        yield args
    finally:
        if engine is not None:
            engine.shutdown()
        from awm_grpo.env_client import close_runtimes

        close_runtimes()


def read_config(path: str | None) -> dict[str, Any]:
    """A runtime YAML's keys ({} without one)."""
    if not path:
        return {}
    import yaml

    return yaml.safe_load(Path(path).read_text()) or {}


def evaluate(opts: argparse.Namespace) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in Path(opts.split).read_text().splitlines() if line.strip()]
    if opts.limit:
        records = records[: opts.limit]
    with policy_runtime(opts.model, opts.split, config=read_config(opts.config), seed=opts.seed,
                        temperature=opts.temperature, max_response_len=opts.max_response_len,
                        engine_url=opts.engine_url, serve=opts.openai_base_url is None) as args:
        if opts.openai_base_url is not None:
            return asyncio.run(_run_chat(RolloutConfig.from_args(args), opts, records))
        return asyncio.run(_run_engine(args, records, opts.n, opts.concurrency))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m awm_grpo.eval", description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", required=True, help="prompt JSONL of awm_grpo.data_prep (val.jsonl / test.jsonl)")
    parser.add_argument("--model", help="HF checkpoint folder (served by a CPU engine here) or, with --engine-url, "
                        "the tokenizer folder")
    parser.add_argument("--engine-url", help="a running SGLang-protocol server (/generate) to use instead")
    parser.add_argument("--openai-base-url", help="an OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--openai-model", help="model name for --openai-base-url (default: $OPENAI_MODEL)")
    parser.add_argument("--config", help="runtime YAML with awm_* keys (the launcher writes one per run)")
    parser.add_argument("--n", type=int, default=1, help="episodes per task")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--max-response-len", type=int, default=4096)
    parser.add_argument("--max-tokens-per-turn", type=int, default=1024, help="chat endpoints only")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--limit", type=int, default=0, help="only the first N tasks (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write the episode records here (JSONL)")
    opts = parser.parse_args(argv)
    records = evaluate(opts)
    if opts.out:
        Path(opts.out).parent.mkdir(parents=True, exist_ok=True)
        Path(opts.out).write_text("".join(json.dumps(r, default=str) + "\n" for r in records))
    tables = traces.success_tables(records, ("scenario", "task_type"))
    traces.print_table("scenario", tables["scenario"])
    print()
    traces.print_table("task type", tables["task_type"])
    print(f"\nsuccess rate {success_rate(records):.3f} over {len(records)} episodes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
