"""Warm start: supervised fine-tuning on reference solutions, played through the real rollout.

A small model built from scratch never writes a well-formed tool call, so RL on it starts at zero
reward and learns nothing. This stage gives the embedded CPU default a non-zero start:

1. every train-split task that has a reference solution (the bundled scenarios ship one per task)
   is played by `awm_grpo.rollout.play` with a *teacher policy* that emits the solution's replies
   (list_tools, the calls, the final answer) - so the SFT tokens, chat-template deltas and real
   tool observations are exactly what the RL rollout will produce, and the verifier must say
   `complete` on each (a solution that does not verify is dropped and reported);
2. names must be copied, not memorised: the practice set's renamed worlds (`--practice DIR
   --worlds K`, awm.scenarios.worlds) are real, verified training tasks with invented names, and
   `--counterfactuals K` adds K renamed copies of each practice episode (awm_grpo.warmstart.counterfactual),
   drawn fresh every epoch so that no invented name is seen twice;
3. a model built from scratch gets a tokenizer trained partly on the scenarios' own text
   (`domain_corpus`; with `--split-digits`, one token a digit, so numbers are copied id for id) and,
   with `--drill N`, first learns to copy names, numbers and ids on synthetic episodes
   (awm_grpo.warmstart.drill, `--drill-kinds`);
4. with `--recheck-writes F`, a fraction F of the plans is also played as a *recheck*: the plan up
   to its first write, played twice (reads, write, the same reads, the same write), then the rest.
   On a right state the second write changes nothing, so the start never sees a repair; but it
   learns that a write can follow "reads after a write", which is where a handed-over wrong write
   must be repaired (awm_grpo.recovery.testbed). For plans whose writes set values (idempotent):
   a recheck of a create would add a second row and is dropped if the verifier then rejects it;
5. the model is trained with masked next-token loss on the model tokens (loss mask 1 only);
6. the result is saved as a Hugging Face folder, the recipe's `--hf-checkpoint`.

    python -m awm_grpo.warmstart --data runs/awm_grpo/splits --out runs/awm_grpo/models/tiny-awm-sft
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from awm_grpo import protocol
from awm_grpo.chat import ChatEncoder
from awm_grpo.rollout import Policy, RolloutConfig, chat_encoder, play
from awm_grpo.warmstart.counterfactual import counterfactuals, renamable
from awm_grpo.warmstart.drill import KINDS, drill_episodes
from slime.arguments import parse_args
from slime.rollout.sglang_rollout import GenerateState
from slime.utils.types import Sample

logger = logging.getLogger("awm_grpo.warmstart")

# The architecture of the embedded default: 336k parameters with the 4,096-token vocab (tied
# embeddings), the model of most of the CPU figures (docs/results.md). Wider ones train and serve 5-10x slower
# on 2 cores (the 1.3M one did no better on held-out tasks); a deeper one is cheap, because the
# 4,096 x 64 output layer dominates the compute: 6 layers (484k) train 1.4x slower and did best on
# the practice set (docs/results.md), measured there only: `--layers 6`.
SMALL_CONFIG = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 16}


# Domain text is repeated this many times in the tokenizer's training text, so that the environments'
# words (tool names, field names, the tasks' vocabulary) win BPE merges over the standard library's:
# `list_pharmacies` becomes 3 tokens instead of 8, and a small model that must recall and copy names
# does so over fewer, more meaningful pieces.
DOMAIN_WEIGHT = 5


def domain_corpus(data_dir: str | None, prompts: list[dict[str, Any]]) -> list[str]:
    """Tokenizer training text from the environments the agent acts in: every runnable scenario's
    code, DB schema and description, plus the given (train-split) task texts. Only train tasks: the
    val/test tasks' wording must not shape the vocabulary the held-out figures are measured with."""
    from awm.data import AWMDataset, bundled_data_dir

    dataset = AWMDataset(data_dir or bundled_data_dir())
    texts = []
    for name in dataset.scenario_names(runnable_only=True):
        scenario = dataset.scenario(name)
        texts += [scenario.full_code or "", json.dumps(scenario.db_schema or {}, indent=2), scenario.description or ""]
    texts += [str(record.get("metadata", {}).get("task", "")) for record in prompts]
    return [t for t in texts if t]


def small_base(out_dir: str | Path, seed: int = 0, domain: list[str] | None = None, layers: int | None = None,
               split_whitespace: bool = False, split_digits: bool = False, chat_template: str | None = None) -> str:
    """The from-scratch model of the embedded default (SMALL_CONFIG, a local 4,096-token tokenizer).

    The tokenizer is trained on the standard-library files of slime.models.tiny plus `domain`
    (DOMAIN_WEIGHT times) when given, with whitespace as tokens of its own when `split_whitespace` and
    every digit a token of its own when `split_digits` (slime.models.tiny.build_tokenizer); `layers`
    overrides SMALL_CONFIG's depth; `chat_template` (Jinja text, e.g. Qwen3-4B's) replaces the built-in
    Qwen-style template."""
    from slime.models.tiny import build_tiny_model, stdlib_corpus

    config = {**SMALL_CONFIG, **({"num_hidden_layers": layers} if layers else {})}
    corpus = stdlib_corpus() + domain * DOMAIN_WEIGHT if domain else None
    return str(build_tiny_model(out_dir, seed=seed, corpus=corpus, split_whitespace=split_whitespace,
                                split_digits=split_digits, chat_template=chat_template, **config))


def base_dir(out: Path) -> Path:
    """Where the from-scratch base of a warm start into `out` is built: one per output folder, so warm
    starts running side by side in one folder (other seeds) never load or overwrite each other's base."""
    return out.parent / f"{out.name}-base"


def reference_replies(solution: Any, tool_mode: str, list_tools: bool = True) -> list[str]:
    """The replies a perfect agent writes for a reference solution, in the rollout's call format.

    Meta mode opens with list_tools unless `list_tools` is False: then the agent calls call_tool
    directly by name, which keeps the task text a few tokens from the call that must copy from it
    (a small model copies over a short distance far better than across a tool listing)."""
    def block(name: str, arguments: dict[str, Any]) -> str:
        return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"

    if tool_mode == "native":
        replies = [block(c["tool"], c["arguments"]) for c in solution.calls]
    else:
        replies = [block(protocol.LIST_TOOLS, {})] if list_tools else []
        replies += [block(protocol.CALL_TOOL, {"tool_name": c["tool"], "arguments": c["arguments"]})
                    for c in solution.calls]
    return replies + [solution.final_answer or "Done."]


def recheck_plan(calls: list[dict[str, Any]], labels: dict[str, str]) -> list[dict[str, Any]] | None:
    """The plan with its part up to the first write played twice (None: the plan writes nothing)."""
    first = next((i for i, c in enumerate(calls) if labels.get(c["tool"], "read") != "read"), None)
    return None if first is None else calls[:first + 1] + calls[:first + 1] + calls[first + 1:]


def teacher_policy(tokenizer: Any, replies: list[str]) -> Policy:
    """Answers each model turn with the next scripted reply, closed by the end-of-turn token."""
    end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    queue = list(replies)

    async def turn(input_ids: list[int], params: dict[str, Any]) -> dict[str, Any]:
        text = queue.pop(0) if queue else "Done."
        ids = list(tokenizer.encode(text, add_special_tokens=False)) + [end_id]
        limit = params.get("max_new_tokens", len(ids))
        finish = {"type": "stop"} if len(ids) <= limit else {"type": "length"}
        ids = ids[:limit]
        return {"meta_info": {"output_token_logprobs": [[0.0, i, None] for i in ids], "finish_reason": finish,
                              "weight_version": "teacher"}}

    return turn


class Episodes:
    """The verified reference episodes, and how to draw renamed copies of the renamable ones.

    `epoch(rng)` is what one SFT epoch trains on: every episode plus `copies` fresh counterfactual
    copies of each practice episode. Fresh names every epoch leave copying as the only way to lower
    the loss on name tokens; fixed copies can be memorised like the originals."""

    def __init__(self, encoder: Any, copies: int, max_len: int) -> None:
        self.encoder, self.copies, self.max_len = encoder, copies, max_len
        self.real: list[Sample] = []
        self.renamable: list[tuple[Sample, list[dict[str, Any]], dict[str, Any]]] = []
        self.rechecks = 0  # how many of `real` are recheck plans (--recheck-writes)

    def renamed(self, rng: random.Random) -> list[Sample]:
        out: list[Sample] = []
        for sample, messages, slots in self.renamable:
            out += counterfactuals(self.encoder, sample, messages, slots, self.copies, rng, self.max_len)
        return out

    def epoch(self, rng: random.Random) -> list[Sample]:
        return self.real + self.renamed(rng)


async def collect(args: argparse.Namespace, prompts: list[dict[str, Any]], data_dir: str | None,
                  counterfactual_copies: int = 0, list_tools: bool = True, recheck: float = 0.0,
                  seed: int = 0) -> Episodes:
    """Play every prompt's reference solution (and, for a `recheck` fraction of them, its recheck
    plan: `recheck_plan`); keep the episodes the verifier accepts."""
    from awm.data import AWMDataset, bundled_data_dir
    from awm.solutions import load_solutions

    from awm_grpo.recovery.progress import tool_semantics

    solutions = load_solutions(data_dir)
    rng, labels, dataset = random.Random(seed), {}, None
    tokenizer = GenerateState(args).tokenizer
    dropped = []
    encoder = None
    if counterfactual_copies:
        if args.awm_tool_mode != "meta":
            raise SystemExit("--counterfactuals needs --tool-mode meta (native prompts carry the tool schemas)")
        encoder = chat_encoder(tokenizer, RolloutConfig.from_args(args), [])  # meta mode: no tools in the prompt
    episodes = Episodes(encoder, counterfactual_copies, args.rollout_max_response_len)
    for i, record in enumerate(tqdm(prompts, desc="reference episodes", file=sys.stderr)):
        meta = record["metadata"]
        solution = solutions.get((meta["scenario"], meta["task_idx"]))
        if solution is None:
            dropped.append((meta["scenario"], meta["task_idx"], "no reference solution"))
            continue
        plans = [solution]
        if recheck and rng.random() < recheck:
            if meta["scenario"] not in labels:
                dataset = dataset or AWMDataset(data_dir or bundled_data_dir())
                labels[meta["scenario"]] = tool_semantics(dataset.scenario(meta["scenario"]).full_code)[0]
            calls = recheck_plan(solution.calls, labels[meta["scenario"]])
            if calls is not None:
                plans.append(dataclasses.replace(solution, calls=calls))
        for n, plan in enumerate(plans):
            sample = Sample(index=i, group_index=i, prompt=record["text"], metadata=dict(meta))
            policy = teacher_policy(tokenizer, reference_replies(plan, args.awm_tool_mode, list_tools))
            sample = await play(args, sample, {"max_new_tokens": args.rollout_max_response_len}, policy)
            awm = sample.metadata["awm"]
            if awm["verdict"] != "complete":
                why = f"{awm['verdict']} ({awm['stop_reason']})"
                dropped.append((meta["scenario"], meta["task_idx"], f"recheck plan: {why}" if n else why))
                continue
            trace = sample.metadata.pop("awm_trace", None) or {}
            episodes.real.append(sample)
            episodes.rechecks += n
            if counterfactual_copies and solution.slots:
                source = (sample, trace.get("messages") or [], solution.slots)
                if renamable(encoder, *source):
                    episodes.renamable.append(source)
    for scenario, task_idx, why in dropped:
        logger.warning("no SFT example for %s#%d: %s", scenario, task_idx, why)
    if counterfactual_copies:
        logger.info("%d of %d episodes get %d fresh counterfactual copies every epoch (the others: nothing to "
                    "rename, or a rebuild that differs from the episode)", len(episodes.renamable),
                    len(episodes.real), counterfactual_copies)
    return episodes


def sft(model: torch.nn.Module, episodes: Episodes, *, epochs: int, lr: float, seed: int,
        batch_size: int = 1, after_epoch: Callable[[int, list[float]], None] | None = None) -> list[float]:
    """Masked next-token loss on model tokens, mean over a batch's model tokens:

        L = -sum_{b,t} m_{b,t} log p(x_{b,t} | x_{b,<t}) / sum_{b,t} m_{b,t}

    Each epoch trains on `episodes.epoch(rng)` (fresh renamed copies every epoch) in batches of
    `batch_size` episodes of similar length (right-padded, padding masked out of attention and
    loss), shuffled with `seed`. `after_epoch(epoch, losses)` runs after each epoch (1-based), e.g. to
    keep intermediate checkpoints."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    losses = []
    bar = tqdm(range(epochs), desc="sft epochs", file=sys.stderr)
    for epoch in bar:
        samples = episodes.epoch(rng)
        by_length = sorted(range(len(samples)), key=lambda i: len(samples[i].tokens))
        batches = [by_length[i:i + batch_size] for i in range(0, len(by_length), batch_size)]
        rng.shuffle(batches)
        total = 0.0
        for batch in batches:
            width = max(len(samples[i].tokens) for i in batch)
            ids = torch.zeros(len(batch), width, dtype=torch.long)
            attention = torch.zeros(len(batch), width, dtype=torch.long)
            mask = torch.zeros(len(batch), width)
            for row, i in enumerate(batch):
                s = samples[i]
                n, prompt_len = len(s.tokens), len(s.tokens) - s.response_length
                ids[row, :n] = torch.tensor(s.tokens)
                attention[row, :n] = 1
                mask[row, prompt_len:n] = torch.tensor(s.loss_mask, dtype=torch.float32)
            logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float()
            nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1),
                                                    reduction="none").view(len(batch), -1)
            loss = (nll * mask[:, 1:]).sum() / mask[:, 1:].sum().clamp(min=1)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            total += loss.item()
        losses.append(total / max(len(batches), 1))
        bar.set_postfix(loss=f"{losses[-1]:.3f}", episodes=len(samples))
        if after_epoch is not None:
            after_epoch(epoch + 1, losses)
    return losses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m awm_grpo.warmstart", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="splits folder of awm_grpo.data_prep (uses train.jsonl)")
    parser.add_argument("--out", required=True, help="where to write the fine-tuned HF model folder")
    parser.add_argument("--base", default=None, help="HF model folder to start from (default: build the small "
                        "from-scratch model of the embedded default with slime.models.tiny)")
    parser.add_argument("--data-dir", default=None, help="AWM data folder with reference_solutions.jsonl "
                        "(default: the bundled scenarios)")
    parser.add_argument("--tool-mode", default="meta", choices=["meta", "native"])
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--batch-size", type=int, default=1, help="episodes per SFT step (on 2 CPU cores one "
                        "episode a step is fastest: padding costs more than batching saves)")
    parser.add_argument("--max-response-len", type=int, default=2048, help="as the CPU profile (episodes that do not fit are dropped)")
    parser.add_argument("--max-observation-tokens", type=int, default=256, help="as the CPU profile")
    parser.add_argument("--counterfactuals", type=int, default=0, help="renamed copies per practice-set episode "
                        "(awm_grpo.warmstart.counterfactual; needs slot values, i.e. the practice set, and --tool-mode meta)")
    parser.add_argument("--list-tools", action=argparse.BooleanOptionalAction, default=True,
                        help="meta mode: open each reference episode with list_tools (--no-list-tools: call "
                        "call_tool directly, the shorter episode a small model learns to copy names in)")
    parser.add_argument("--tokenizer-corpus", default=None, choices=["domain", "stdlib"],
                        help="from-scratch base only: train its tokenizer on the standard library plus the "
                        "scenarios' code, schemas and train tasks (domain, the default), or on the standard "
                        "library only")
    parser.add_argument("--split-whitespace", action=argparse.BooleanOptionalAction, default=None,
                        help="from-scratch base only: whitespace gets tokens of its own, so a name or number has "
                        "the same ids in a tool result (`\"author\": \"Richard`) and in the answer (`by Richard`) "
                        "and is copied token for token (default off)")
    parser.add_argument("--split-digits", action=argparse.BooleanOptionalAction, default=None,
                        help="from-scratch base only: every digit is a token of its own, as in Qwen's tokenizers, "
                        "so a number has the same ids in a tool result (`\"price\": 4.59`) and in the answer "
                        "(`$4.59`) (default off)")
    parser.add_argument("--chat-template", default=None, metavar="FILE",
                        help="from-scratch base only: ship this Jinja chat template instead of the built-in "
                        "Qwen-style one, e.g. the one Qwen3-4B ships, so the warm start and RL meet the real template")
    parser.add_argument("--enable-thinking", action=argparse.BooleanOptionalAction, default=False,
                        help="render episodes with the template's thinking mode on (Qwen3: no empty think block in "
                        "the generation prompt); must match the RL run's AWM_ENABLE_THINKING (default off, as the "
                        "CPU profile)")
    parser.add_argument("--layers", type=int, default=None, help="from-scratch base only: transformer layers "
                        f"(default {SMALL_CONFIG['num_hidden_layers']}; 6 did best on the practice set, 1.4x slower)")
    parser.add_argument("--drill", type=int, default=0, metavar="N", help="first train on N synthetic copy-drill "
                        "episodes (awm_grpo.warmstart.drill; meta mode; 2000 did well for the 6-layer model)")
    parser.add_argument("--drill-epochs", type=int, default=5)
    parser.add_argument("--drill-kinds", default="name", metavar="K[,K]",
                        help="what the drill makes the model copy (awm_grpo.warmstart.drill.KINDS): name (a name from the "
                        "task into the call and from the result into the answer), value (a number from the result "
                        "into the answer), id (an id from one result into the next call); default name")
    parser.add_argument("--save-every", type=int, default=0, metavar="K", help="also save the model after every "
                        "K epochs to OUT/epoch_<N>, to compare RL starts trained for fewer epochs")
    parser.add_argument("--recheck-writes", type=float, default=0.0, metavar="F",
                        help="also play a fraction F of the plans as rechecks: up to the first write twice "
                             "(reads, write, reads, the same write), then the rest; for plans whose writes set "
                             "values (the recovery testbed). Default 0")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (one step of this small model gains "
                        "nothing from more, and more slow down everything else on a busy machine)")
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.manual_seed(opts.seed)
    torch.set_num_threads(opts.threads)
    if not 0.0 <= opts.recheck_writes <= 1.0:
        raise SystemExit(f"--recheck-writes {opts.recheck_writes}: a fraction between 0 and 1")
    if opts.drill and opts.tool_mode != "meta":
        raise SystemExit("--drill needs --tool-mode meta (its episodes call call_tool)")
    kinds = tuple(k.strip() for k in opts.drill_kinds.split(",") if k.strip())
    if not kinds or set(kinds) - set(KINDS):
        raise SystemExit(f"--drill-kinds {opts.drill_kinds!r}: a comma-separated list of {', '.join(KINDS)}")
    out = Path(opts.out)
    train = Path(opts.data) / "train.jsonl"
    if not train.is_file():
        raise SystemExit(f"{train} does not exist: write the splits first with `python -m awm_grpo.data_prep --out "
                         f"{opts.data}`")
    prompts = [json.loads(line) for line in train.read_text().splitlines() if line.strip()]
    base = opts.base
    if base is None:
        domain = None if opts.tokenizer_corpus == "stdlib" else domain_corpus(opts.data_dir, prompts)
        template = None
        if opts.chat_template:
            try:
                template = Path(opts.chat_template).read_text(encoding="utf-8")
            except OSError as exc:
                raise SystemExit(f"--chat-template {opts.chat_template}: {exc.strerror}") from None
        base = small_base(base_dir(out), seed=opts.seed, domain=domain, layers=opts.layers,
                          split_whitespace=bool(opts.split_whitespace), split_digits=bool(opts.split_digits),
                          chat_template=template)
    elif (opts.layers is not None or opts.tokenizer_corpus is not None or opts.split_whitespace is not None
          or opts.split_digits is not None or opts.chat_template is not None):
        raise SystemExit("--layers, --tokenizer-corpus, --split-whitespace, --split-digits and --chat-template shape "
                         "the from-scratch base: drop them or --base")
    args = parse_args(["--hf-checkpoint", base, "--prompt-data", str(train), "--rollout-batch-size", "1",
                       "--num-rollout", "1", "--rollout-max-response-len", str(opts.max_response_len)])
    args.awm_tool_mode, args.awm_data_dir = opts.tool_mode, opts.data_dir
    args.awm_max_observation_tokens, args.awm_max_turns = opts.max_observation_tokens, 64
    args.awm_enable_thinking = opts.enable_thinking
    started = time.perf_counter()
    episodes = asyncio.run(collect(args, prompts, opts.data_dir, opts.counterfactuals, opts.list_tools,
                                   opts.recheck_writes, opts.seed))
    if not episodes.real:
        raise SystemExit("no reference episode verified: nothing to fine-tune on")
    tokens = sum(len(s.tokens) for s in episodes.real)
    logger.info("%d SFT episodes (%d of them rechecks; %d tokens) in %.1fs", len(episodes.real), episodes.rechecks,
                tokens, time.perf_counter() - started)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    tokenizer = GenerateState(args).tokenizer
    drill_losses: list[float] = []
    if opts.drill:
        drill = Episodes(None, 0, opts.max_response_len)
        # No system prompt: copying is learnt much faster over a short context, and the skill carries
        # over to the real, prompted episodes (6-layer model, practice set, SFT loss after 4 epochs:
        # 0.38 after this drill, 0.56 after the same drill with the system prompt, 0.81 with none).
        short = ChatEncoder(tokenizer, "", None, {"enable_thinking": RolloutConfig.from_args(args).enable_thinking})
        drill.real = drill_episodes(short, opts.drill, seed=opts.seed, kinds=kinds)
        logger.info("copy drill: %d synthetic episodes (%s) x %d epochs first", opts.drill, ",".join(kinds),
                    opts.drill_epochs)
        drill_losses = sft(model, drill, epochs=opts.drill_epochs, lr=opts.lr, seed=opts.seed, batch_size=8)

    def save(folder: Path, losses: list[float]) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        record = {"base": base, "episodes": len(episodes.real), "tokens": tokens, "epochs": len(losses),
                  "lr": opts.lr, "batch_size": opts.batch_size, "losses": losses, "tool_mode": opts.tool_mode,
                  "counterfactuals": opts.counterfactuals, "list_tools": opts.list_tools,
                  "tokenizer_corpus": None if opts.base else opts.tokenizer_corpus or "domain",
                  "layers": opts.layers, "split_whitespace": None if opts.base else bool(opts.split_whitespace),
                  "split_digits": None if opts.base else bool(opts.split_digits),
                  "drill": opts.drill, "drill_epochs": opts.drill_epochs if opts.drill else 0,
                  "drill_kinds": list(kinds) if opts.drill else [],
                  "drill_losses": drill_losses, "seed": opts.seed, "chat_template": opts.chat_template,
                  "enable_thinking": opts.enable_thinking, "recheck_writes": opts.recheck_writes,
                  "recheck_episodes": episodes.rechecks}
        (folder / "warmstart.json").write_text(json.dumps(record, indent=1))

    def after_epoch(epoch: int, losses: list[float]) -> None:
        if opts.save_every and epoch % opts.save_every == 0 and epoch < opts.epochs:
            save(out / f"epoch_{epoch}", losses)

    losses = sft(model, episodes, epochs=opts.epochs, lr=opts.lr, seed=opts.seed, batch_size=opts.batch_size,
                 after_epoch=after_epoch)
    save(out, losses)
    logger.info("saved %s (loss %.3f -> %.3f)", out, losses[0], losses[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
