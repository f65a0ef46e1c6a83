"""Command-line flags of `python -m slime.train` (and `python -m slime.train_async`), spelled as slime spells them.

Launch scripts written for slime run unchanged as far as the flags below go; flags this trainer
does not implement are rejected with a message (argparse), not silently ignored, except tuning flags
that change only speed or memory (`_IGNORED_MEGATRON_FLAGS`: Megatron's dropout/fusion/recompute-method/
optimizer-placement knobs, --balance-data) and Megatron's model-architecture flags (`_MEGATRON_MODEL_FLAGS`,
the MODEL_ARGS of slime's scripts/models/*.sh: the architecture here is --hf-checkpoint's config.json),
which are accepted and ignored. Megatron's parallel sizes (--tensor-model-parallel-size, ...) are accepted at 1 only,
and --bf16 with --train-backend fsdp only: no backend here implements the rest, so a value that would
change the run is refused instead of dropped.
Every key of the YAML given by `--custom-config-path` is `setattr` onto `args` (plugins read them).

Supported slime flags, by group (defaults are slime's unless marked "ours"):

- cluster: --actor-num-nodes, --actor-num-gpus-per-node, --num-gpus-per-node, --rollout-num-gpus,
  --rollout-num-gpus-per-engine, --colocate, --offload, --offload-train, --offload-rollout (the
  colocated memory hand-over: engines release memory while the trainer trains, the trainer moves to
  host memory while engines generate; on by default under --colocate with SGLang engines),
  --distributed-timeout-minutes, --train-backend:
  `torch` (HF model; N = actor nodes x GPUs per node data-parallel ranks, gradients summed over
  gloo on CPU / nccl on GPU), `fsdp` (ours, slime's old FSDP backend name: the torch backend with
  FSDP2 parameter/gradient/optimizer sharding, required on GPU for Qwen3-4B on 80 GB cards; `--bf16`
  then computes in bf16 with fp32 weights; `--bf16` is refused with the other backends, which train
  in fp32), `megatron` (a megatron-core GPTModel
  with TP = PP = 1 trained by the torch loop, needs megatron-core from a GPU set; CPU-tested when
  installed, GPU untested; see slime/backends/megatron_backend.py); --recompute-granularity full (HF gradient checkpointing +
  LM-head chunk recompute) or selective (LM-head chunks only)
- model: --hf-checkpoint, --model-name, --ref-load
- data: --prompt-data (JSONL; parquet with pyarrow; `file@[start:end]` row slices), --input-key (a
  non-string prompt without --apply-chat-template stays as it is for the generate function), --label-key
  (the value as is: a dict stays a dict), --metadata-key, --extra-metadata-keys (ours: row keys copied
  into the sample's metadata under their own names), --tool-key, --apply-chat-template,
  --apply-chat-template-kwargs, --rollout-shuffle, --rollout-seed, --num-rollout, --num-epoch,
  --disable-rollout-global-dataset, --data-source-path (a class built as cls(args)), --buffer-filter-path
- rollout: --rollout-batch-size, --n-samples-per-prompt, --over-sampling-batch-size,
  --rollout-temperature, --rollout-top-p, --rollout-top-k, --rollout-max-response-len,
  --rollout-max-prompt-len, --rollout-max-context-len, --rollout-stop, --rollout-stop-token-ids, --rollout-skip-special-tokens,
  --partial-rollout, --mask-offpolicy-in-partial-rollout, --global-batch-size (sets --num-steps-per-rollout),
  --sglang-server-concurrency, --sglang-mem-fraction-static, --sglang-router-ip, --sglang-router-port,
  --sglang-dp-size, --sglang-enable-dp-attention, --sglang-attention-backend (SGLang engines only),
  --sglang-enable-deterministic-inference
  (the CPU engine with --engine-max-batch-size 1), --sglang-cuda-graph-bs (accepted and ignored: speed only,
  and sglang 0.5.23 has no such flag)
- plugins: --rollout-function-path, --eval-function-path (default: the rollout function, called
  with evaluation=True), --custom-generate-function-path, --custom-rm-path, --group-rm, --reward-key,
  --dynamic-sampling-filter-path, --custom-config-path, --custom-rollout-log-function-path and
  --custom-eval-rollout-log-function-path (slime's bool return; ours also takes a dict of metrics),
  --eval-reward-key, --rm-type, --rm-url, --custom-reward-post-process-path, --rollout-sample-hook-path,
  --rollout-sample-filter-path,
  --rollout-all-samples-process-path, --rollout-data-postprocess-path,
  --custom-convert-samples-to-train-data-path, --custom-tis-function-path,
  --custom-advantage-function-path (ours: `fn(args, samples) -> list[float | list[float]]`, not
  slime's `fn(args, rollout_data)`)
- algorithm: --advantage-estimator (grpo, gspo, cispo, reinforce_plus_plus,
  reinforce_plus_plus_baseline, ppo; rloo is ours), --gamma, --lambd, --normalize-advantages,
  --value-clip, --critic-load, --critic-lr, --num-critic-only-steps, --eps-clip, --eps-clip-high, --eps-clip-c,
  --use-kl-loss, --kl-loss-coef, --kl-loss-type, --use-unbiased-kl, --entropy-coef,
  --disable-rewards-normalization, --disable-grpo-std-normalization, --calculate-per-token-loss,
  --use-tis, --tis-clip, --tis-clip-low, --use-rollout-logprobs, --num-steps-per-rollout,
  --use-opd, --opd-type (sglang: the teacher's log-probs come from --rm-url during the rollout; megatron is
  refused), --opd-kl-coef, --opd-teacher-load / --opd-teacher-ckpt-step (megatron teachers only: refused),
  --loss-type (policy_loss, sft_loss: masked NLL with the same aggregation; custom_loss is not implemented)
- optimizer: --lr, --clip-grad, --seed, --weight-decay, --adam-beta1, --adam-beta2, --adam-eps,
  --lr-warmup-iters, --max-tokens-per-gpu, --micro-batch-size (caps samples per micro-batch)
- lora (upstream's FSDP-backend names; torch and fsdp backends): --lora-rank (0: off), --lora-alpha,
  --target-modules, --exclude-modules, --lora-adapter-path, --lora-dropout (upstream's Megatron-bridge flag)
- weights: --update-weight-transport (disk; tensor: CUDA IPC to colocated SGLang engines, shared memory
  to CPU engines; nccl with --engine-type sglang on separate GPUs, GPU only: refused with --colocate,
  see `finalize_args`),
  --update-weight-disk-dir, --update-weight-disk-keep-files, --update-weights-interval,
  --update-weight-buffer-size
- checkpoints: --load, --save, --save-interval, --keep-checkpoints (ours), --start-rollout-id
- eval: --eval-interval, --eval-prompt-data, --n-samples-per-eval-prompt, --skip-eval-before-train,
  --eval-temperature, --eval-top-p, --eval-top-k, --eval-max-response-len, --eval-max-context-len (each
  defaults to its --rollout-* value)
- fault tolerance: --rollout-health-check-interval, --rollout-health-check-timeout,
  --max-step-retries (ours)
- logging: --use-tensorboard, --tensorboard-dir, --use-wandb, --wandb-project, --wandb-group,
  --wandb-dir, --wandb-mode (offline by default here), --wandb-key, --metrics-path (ours: JSONL, one line a step)
- CI: --ci-test, --ci-train-rollout-logprob-abs-diff-threshold
- ours: --engine-type (cpu; sglang launches real SGLang servers, GPU only, UNTESTED here),
  --rollout-router (none: rollouts spread groups over the engines themselves; slime: our router in
  front, slime/engine/router.py; sglang: sglang_router's launch_router, tested on CPU), --router-policy,
  --ray-address, --ray-num-cpus, --engine-max-batch-size, --engine-seed, --engine-prefix-cache-tokens,
  --over-sampling-policy (eager: slime's; adaptive: only what the filter's pass rate says the batch lacks)

Parsed but refused when given (`_AWAITING_WIRING`: the trainer here trains on Samples, not on upstream's
train-data dict): --custom-convert-samples-to-train-data-path, --rollout-data-postprocess-path.

Not implemented: --kl-coef (KL in the reward: use --use-kl-loss; with --kl-loss-coef 0, as slime's
scripts pass, the KL term has weight 0), critic-side flags beyond those above (--critic-num-nodes, ...),
--loss-type custom_loss, tensor/pipeline/context/expert parallelism (sizes other than 1 are refused),
--sglang-dp-size above 1 on the CPU engine, bf16 outside fsdp.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from typing import Any

import yaml

from slime.engine.router_process import SGLANG_ROUTER_POLICIES

# Megatron flags that launch scripts commonly pass; slime's parser ignores what it does not use.
_IGNORED_MEGATRON_FLAGS = (
    "--optimizer",
    "--sequence-parallel",
    "--use-dynamic-batch-size",
    "--recompute-method",
    "--recompute-num-layers",
    "--attention-dropout",
    "--hidden-dropout",
    "--accumulate-allreduce-grads-in-fp32",
    "--attention-softmax-in-fp32",
    "--attention-backend",
    "--lr-decay-style",
    # Megatron's optimizer memory placement (CPU offload, precision-aware state): speed and memory only.
    "--optimizer-cpu-offload",
    "--overlap-cpu-optimizer-d2h-h2d",
    "--use-precision-aware-optimizer",
    # slime's FLOP balancing of samples over data-parallel ranks: which rank computes which sample only.
    "--balance-data",
)

# Megatron's model-architecture flags (scripts/models/*.sh of slime, sourced by every launch script as
# MODEL_ARGS). Here the architecture is the --hf-checkpoint folder's config.json, so they are accepted
# with their types (plugins may read e.g. args.num_layers) and otherwise ignored. None: a switch.
_MEGATRON_MODEL_FLAGS: dict[str, type | None] = {
    "--num-layers": int, "--hidden-size": int, "--ffn-hidden-size": int, "--num-attention-heads": int,
    "--num-query-groups": int, "--kv-channels": int, "--vocab-size": int, "--norm-epsilon": float,
    "--rotary-base": int, "--rotary-percent": float, "--normalization": str, "--position-embedding-type": str,
    "--swiglu": None, "--group-query-attention": None, "--use-rotary-position-embeddings": None,
    "--disable-bias-linear": None, "--add-qkv-bias": None, "--qk-layernorm": None,
    "--untie-embeddings-and-output-weights": None,
    "--num-experts": int, "--moe-ffn-hidden-size": int, "--moe-router-topk": int, "--moe-layer-freq": str,
    "--moe-router-score-function": str, "--moe-token-dispatcher-type": str, "--moe-token-drop-policy": str,
    "--moe-router-dtype": str, "--moe-aux-loss-coeff": float, "--moe-grouped-gemm": None,
    "--moe-permute-fusion": None,
}


# Megatron's model-parallel sizes: accepted at 1 (launch scripts spell them out), refused otherwise.
_PARALLEL_SIZE_FLAGS = (
    "--tensor-model-parallel-size",
    "--pipeline-model-parallel-size",
    "--context-parallel-size",
    "--expert-model-parallel-size",
    "--expert-tensor-parallel-size",
)


# slime's plugin flags that parse here but that no code of this trainer calls yet: refused when given, so
# that a plugin is never skipped silently. Delete an entry in the change that makes the trainer call it.
_AWAITING_WIRING: dict[str, str] = {
    "custom_convert_samples_to_train_data_path": "the trainer builds its own train data from the samples",
    "rollout_data_postprocess_path": "the trainer does not call a hook on the train data",
}
DEFAULT_DATA_SOURCE = "slime.rollout.data_source.RolloutDataSourceWithBuffer"


class ArgumentError(ValueError):
    """Flags that parse but contradict each other."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m slime.train",
        description="RL post-training (GRPO family) with slime's flags; runs on CPU with the CPU engine.",
    )
    g = p.add_argument_group("cluster")
    g.add_argument("--actor-num-nodes", type=int, default=1)
    g.add_argument("--actor-num-gpus-per-node", type=int, default=1,
                   help="train ranks per node (data parallel; one Ray actor each)")
    g.add_argument("--num-gpus-per-node", type=int, default=8)
    g.add_argument("--rollout-num-gpus", type=int, default=None,
                   help="devices for engines (default: 1 engine; = actor devices under --colocate)")
    g.add_argument("--rollout-num-gpus-per-engine", type=int, default=1)
    g.add_argument("--colocate", action="store_true", help="train actor and engines share bundles")
    g.add_argument("--offload", action="store_true", help="= --offload-train --offload-rollout")
    g.add_argument("--offload-train", action=argparse.BooleanOptionalAction, default=None,
                   help="trainer weights and optimizer state go to host memory while engines generate "
                        "(default: on under --colocate with --engine-type sglang)")
    g.add_argument("--offload-rollout", action=argparse.BooleanOptionalAction, default=None,
                   help="engines release weights and KV cache while the trainer trains; weights are re-sent "
                        "every step (default: on under --colocate with --engine-type sglang)")
    g.add_argument("--train-backend", default="torch", choices=["torch", "fsdp", "megatron"],
                   help="torch: replicated data parallel; fsdp: FSDP2 sharding; megatron: megatron-core model, TP=PP=1")
    g.add_argument("--distributed-timeout-minutes", type=float, default=10.0)
    g.add_argument("--bf16", action="store_true",
                   help="bf16 compute with fp32 weights and optimizer state (--train-backend fsdp only)")
    for flag in _PARALLEL_SIZE_FLAGS:
        g.add_argument(flag, type=int, default=1, help="Megatron's parallel size: only 1 is implemented")
    g.add_argument("--recompute-granularity", default=None, choices=["full", "selective"],
                   help="full: gradient checkpointing of every layer; selective: LM-head chunks only")
    g.add_argument("--engine-type", default="cpu", choices=["cpu", "sglang"],
                   help="ours: rollout engine implementation (sglang: real SGLang servers, GPU)")
    g.add_argument("--rollout-router", default="none", choices=["none", "slime", "sglang"],
                   help="ours: router in front of the engines (slime: ours; sglang: sglang_router)")
    g.add_argument("--router-policy", default=None, choices=SGLANG_ROUTER_POLICIES,
                   help="sglang_router's load-balancing policy (--rollout-router sglang; default: its cache_aware)")
    g.add_argument("--engine-max-batch-size", type=int, default=64, help="ours: CPU engine batch cap")
    g.add_argument("--engine-seed", type=int, default=0, help="ours: CPU engine sampling seed")
    g.add_argument("--engine-dtype", default="float32", choices=["float32", "bfloat16"],
                   help="ours: what the CPU engine computes in, and so the dtype of its weight syncs and exports "
                        "(float32: the trainer's, rollouts match its log-probs; bfloat16: what SGLang engines serve)")
    g.add_argument("--engine-prefix-cache-tokens", type=int, default=1 << 16,
                   help="ours: CPU engine prefix KV cache budget in tokens (multi-turn prompts reuse the "
                        "previous turn's KV); 0: off")
    g.add_argument("--ray-address", default=None, help="ours: join this Ray cluster instead of starting one")
    g.add_argument("--ray-num-cpus", type=int, default=8,
                   help="ours: logical CPUs of the local Ray cluster (may exceed the real cores)")

    g = p.add_argument_group("model")
    g.add_argument("--hf-checkpoint", required=True, help="HF model folder: tokenizer, engine and trainer init")
    g.add_argument("--model-name", default=None)
    g.add_argument("--ref-load", default=None, help="reference model folder for the KL loss (default: --hf-checkpoint)")

    g = p.add_argument_group("data")
    g.add_argument("--prompt-data", required=True,
                   help="prompt file: JSONL (one JSON object per line) or .parquet (pyarrow); "
                        "FILE@[start:end] reads only those rows")
    g.add_argument("--input-key", default="input")
    g.add_argument("--label-key", default=None)
    g.add_argument("--metadata-key", default="metadata")
    g.add_argument("--extra-metadata-keys", nargs="+", default=None, metavar="KEY",
                   help="ours (upstream slime has no such flag): row keys (parquet columns) copied into "
                        "each sample's metadata under their own names, beside --metadata-key's object; a "
                        "row without one (or with null) is an error naming file and row")
    g.add_argument("--apply-chat-template", action="store_true")
    g.add_argument("--apply-chat-template-kwargs", type=json.loads, default={})
    g.add_argument("--rollout-shuffle", action="store_true")
    g.add_argument("--rollout-seed", type=int, default=42)
    g.add_argument("--num-rollout", type=int, default=None, help="training steps (or use --num-epoch)")
    g.add_argument("--num-epoch", type=int, default=None)
    g.add_argument("--tool-key", default="tools",
                   help="row key of the tool schemas given to the chat template (a list, or a JSON string of one); "
                        "also put in the sample's metadata['tools']")
    g.add_argument("--disable-rollout-global-dataset", dest="rollout_global_dataset", action="store_false",
                   help="do not read --prompt-data: the data source hands out empty samples and the rollout "
                        "function brings its own data (needs --num-rollout)")
    g.add_argument("--data-source-path", default=DEFAULT_DATA_SOURCE,
                   help="class built as cls(args) that the rollout draws prompt groups from (slime's DataSource "
                        "interface: get_samples, add_samples, save, load, __len__)")
    g.add_argument("--buffer-filter-path", default=None,
                   help="fn(args, rollout_id, buffer, num_samples) -> list[list[Sample]]: takes the groups served "
                        "first from the data source's buffer (default: pop_first, the oldest first)")

    g = p.add_argument_group("rollout")
    g.add_argument("--rollout-batch-size", type=int, required=True, help="prompts (groups) per step")
    g.add_argument("--n-samples-per-prompt", type=int, default=1)
    g.add_argument("--over-sampling-batch-size", type=int, default=None)
    g.add_argument("--over-sampling-policy", default="eager", choices=["eager", "adaptive"],
                   help="ours: eager (slime's): pull --over-sampling-batch-size prompts whenever the groups kept and "
                        "in flight cannot make the batch; adaptive: pull only the groups the batch lacks at the "
                        "dynamic filter's pass rate of the previous step (+1), at most --over-sampling-batch-size "
                        "at a time: fewer episodes played and aborted for the same batch")
    g.add_argument("--rollout-temperature", type=float, default=1.0)
    g.add_argument("--rollout-top-p", type=float, default=1.0)
    g.add_argument("--rollout-top-k", type=int, default=-1)
    g.add_argument("--rollout-max-response-len", type=int, default=None)
    g.add_argument("--rollout-max-prompt-len", type=int, default=None)
    g.add_argument("--rollout-max-context-len", type=int, default=None)
    g.add_argument("--rollout-stop", nargs="+", default=None)
    g.add_argument("--rollout-stop-token-ids", type=int, nargs="+", default=None)
    g.add_argument("--rollout-skip-special-tokens", action="store_true")
    g.add_argument("--partial-rollout", action="store_true",
                   help="requests aborted when a step's batch is full keep their tokens and are continued in a "
                        "later step instead of being regenerated")
    g.add_argument("--mask-offpolicy-in-partial-rollout", action="store_true",
                   help="with --partial-rollout: train only on the tokens generated by the latest weights (earlier "
                        "segments get loss mask 0)")
    g.add_argument("--global-batch-size", type=int, default=None,
                   help="samples per optimizer step: --num-steps-per-rollout = rollout-batch-size x "
                        "n-samples-per-prompt / global-batch-size")
    g.add_argument("--sglang-server-concurrency", type=int, default=512)
    g.add_argument("--sglang-mem-fraction-static", type=float, default=None,
                   help="SGLang's --mem-fraction-static (weights + KV cache share of GPU memory; sglang engines)")
    g.add_argument("--sglang-dtype", default=None, choices=["bfloat16", "float16", "float32"],
                   help="SGLang's --dtype, passed to every engine explicitly so that no restart, export or "
                        "checkpoint config can change what it serves (default with --engine-type sglang: "
                        "bfloat16); exports and checkpoints meant for engines are written in it")
    g.add_argument("--sglang-dp-size", type=int, default=None,
                   help="SGLang's --dp-size (data-parallel attention inside one engine; needs "
                        "--sglang-enable-dp-attention; sglang engines only)")
    g.add_argument("--sglang-enable-dp-attention", action="store_true", default=None,
                   help="SGLang's --enable-dp-attention (sglang engines only)")
    g.add_argument("--sglang-attention-backend", default=None,
                   help="SGLang's --attention-backend (sglang engines only; deterministic inference needs "
                        "flashinfer, fa3 or triton)")
    g.add_argument("--sglang-enable-deterministic-inference", action="store_true", default=None,
                   help="SGLang's --enable-deterministic-inference (batch-invariant results); the CPU engine "
                        "gives them with --engine-max-batch-size 1")
    # Accepted and ignored (speed only): sglang 0.5.23 split --cuda-graph-bs into --cuda-graph-bs-decode and
    # --cuda-graph-bs-prefill, so passing it on would stop those engines from starting; SGLang's own list is used.
    g.add_argument("--sglang-cuda-graph-bs", dest="ignored_sglang_cuda_graph_bs", type=int, nargs="+",
                   default=None, help="SGLang's CUDA-graph batch sizes: accepted and ignored (speed only)")
    g.add_argument("--sglang-router-ip", default=None, help="set by the trainer to the engine it starts")
    g.add_argument("--sglang-router-port", type=int, default=None)

    g = p.add_argument_group("plugins")
    g.add_argument("--rollout-function-path", default="slime.rollout.sglang_rollout.generate_rollout",
                   help="fn(args, rollout_id, data_source, evaluation=False) -> RolloutFnTrainOutput "
                        "(or legacy list[list[Sample]]); sync or async")
    g.add_argument("--custom-generate-function-path", default=None)
    g.add_argument("--rollout-sample-hook-path", action="append", default=[],
                   help="repeatable: hook(args, sample, *, rollout_id=None, evaluation=False) -> Sample | None, "
                        "run on every generated Sample before its reward (sync or async)")
    g.add_argument("--custom-rm-path", default=None)
    g.add_argument("--group-rm", action="store_true")
    g.add_argument("--rm-timeout", type=float, default=600.0,
                   help="ours: seconds one reward call may take; past it the call fails naming its samples")
    g.add_argument("--reward-key", default=None)
    g.add_argument("--eval-reward-key", default=None, help="--reward-key for evaluation (default: --reward-key)")
    g.add_argument("--rm-type", default=None,
                   help="built-in reward of slime.rollout.rm_hub when no --custom-rm-path is given")
    g.add_argument("--rm-url", default=None,
                   help="reward service URL of --rm-type remote_rm; with --use-opd --opd-type sglang, the teacher "
                        "engine's /generate (slime.rollout.on_policy_distillation.reward_func posts there)")
    g.add_argument("--custom-reward-post-process-path", default=None,
                   help="fn(args, samples) -> (raw_rewards, rewards): replaces the reward normalisation "
                        "(GRPO's group baseline)")
    g.add_argument("--rollout-sample-filter-path", default=None,
                   help="fn(args, groups) -> None: sets sample.remove_sample on samples the loss must skip")
    g.add_argument("--rollout-all-samples-process-path", default=None,
                   help="fn(args, all_groups, data_source) -> None: sees every generated group, dropped ones too")
    g.add_argument("--rollout-data-postprocess-path", default=None,
                   help="fn(args, rollout_id, rollout_data): called on the train data once log-probs are in "
                        "(e.g. to change loss masks)")
    g.add_argument("--custom-convert-samples-to-train-data-path", default=None,
                   help="fn(args, samples) -> dict: replaces the conversion of samples to train data")
    g.add_argument("--custom-tis-function-path", default=None,
                   help="fn(*, args, pg_loss, train_log_probs, rollout_log_probs, loss_masks, total_lengths, "
                        "response_lengths) -> (pg_loss, loss_masks, metrics): replaces --use-tis's truncated "
                        "importance sampling (per-sample tensor lists)")
    g.add_argument("--dynamic-sampling-filter-path", default=None)
    g.add_argument("--custom-config-path", default=None, help="YAML whose keys become attributes of args")
    g.add_argument("--eval-function-path", default=None,
                   help="rollout function called with evaluation=True (default: --rollout-function-path)")
    g.add_argument("--custom-rollout-log-function-path", default=None,
                   help="fn(rollout_id, args, samples, rollout_extra_metrics, rollout_time) -> bool | dict, "
                        "after each rollout, before training (True: skip default rollout metrics; "
                        "dict: numeric entries merged into the step metrics)")
    g.add_argument("--custom-eval-rollout-log-function-path", default=None,
                   help="fn(rollout_id, args, data, extra_metrics) -> bool | dict, after each eval")
    g.add_argument("--custom-advantage-function-path", default=None,
                   help="ours: fn(args, samples) -> list[float | list[float]] (per sample or per response "
                        "token), replaces --advantage-estimator's advantages")

    g = p.add_argument_group("algorithm")
    g.add_argument("--advantage-estimator", default="grpo",
                   choices=["grpo", "gspo", "cispo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "rloo",
                            "ppo"])
    g.add_argument("--gamma", type=float, default=1.0, help="discount (reinforce_plus_plus, ppo GAE)")
    g.add_argument("--lambd", type=float, default=1.0, help="GAE lambda (ppo)")
    g.add_argument("--value-clip", type=float, default=0.2, help="critic value clip (ppo)")
    g.add_argument("--critic-load", default=None, help="critic init weights (ppo; default: --hf-checkpoint)")
    g.add_argument("--critic-lr", type=float, default=None, help="critic learning rate (ppo; default: --lr)")
    g.add_argument("--num-critic-only-steps", type=int, default=0,
                   help="ppo: first steps train only the critic (the policy waits)")
    g.add_argument("--normalize-advantages", action="store_true",
                   help="whiten advantages over all loss-mask tokens of the step")
    g.add_argument("--eps-clip", type=float, default=0.2)
    g.add_argument("--eps-clip-high", type=float, default=None)
    g.add_argument("--eps-clip-c", type=float, default=None)
    g.add_argument("--use-kl-loss", action="store_true")
    g.add_argument("--kl-loss-coef", type=float, default=0.0)
    g.add_argument("--kl-loss-type", default="k1", choices=["k1", "k2", "k3", "low_var_kl"])
    g.add_argument("--use-unbiased-kl", action="store_true")
    g.add_argument("--entropy-coef", type=float, default=0.0)
    g.add_argument("--disable-rewards-normalization", action="store_true")
    g.add_argument("--disable-grpo-std-normalization", action="store_true")
    g.add_argument("--calculate-per-token-loss", action="store_true",
                   help="token-mean aggregation (default: mean of per-sample means)")
    g.add_argument("--use-tis", action="store_true")
    g.add_argument("--tis-clip", type=float, default=2.0)
    g.add_argument("--tis-clip-low", type=float, default=0.0)
    g.add_argument("--use-rollout-logprobs", action="store_true")
    g.add_argument("--use-opd", action="store_true",
                   help="on-policy distillation: every response token's advantage -= --opd-kl-coef x (student "
                        "log-prob - sample.teacher_log_probs), on top of any estimator; needs --opd-type")
    g.add_argument("--opd-type", default=None, choices=["sglang", "megatron"],
                   help="where the teacher's log-probs come from: sglang = a teacher engine scores each sample "
                        "during the rollout (--custom-rm-path slime.rollout.on_policy_distillation.reward_func, "
                        "--custom-reward-post-process-path ...post_process_rewards, --rm-url TEACHER/generate); "
                        "megatron (a teacher checkpoint forwarded by the trainer) is not supported here")
    g.add_argument("--opd-kl-coef", type=float, default=1.0,
                   help="weight of the distillation term in the advantages (--use-opd)")
    g.add_argument("--opd-teacher-load", default=None,
                   help="teacher checkpoint of --opd-type megatron (not supported here: refused)")
    g.add_argument("--opd-teacher-ckpt-step", type=int, default=None,
                   help="checkpoint step of --opd-teacher-load (--opd-type megatron only)")
    g.add_argument("--num-steps-per-rollout", type=int, default=None,
                   help="optimizer steps per rollout (default: 1, or as --global-batch-size gives)")
    g.add_argument("--loss-type", default="policy_loss", choices=["policy_loss", "sft_loss"],
                   help="sft_loss: masked NLL of the response tokens (advantages ignored), same aggregation")
    g.add_argument("--get-mismatch-metrics", action="store_true",
                   help="log the train/rollout mismatch metrics of --custom-tis-function-path without --use-tis "
                        "(ours: they only report, the loss is not weighted)")
    g.add_argument("--disable-compute-advantages-and-returns", action="store_false",
                   dest="compute_advantages_and_returns",
                   help="no advantages (every one 0): for --loss-type sft_loss, which does not read them")
    g.add_argument("--loss-mask-type", default="qwen", choices=["qwen", "qwen3", "qwen3_5", "distill_qwen"],
                   help="chat layout slime.utils.mask_utils masks by (slime.rollout.sft_rollout)")
    g.add_argument("--debug-train-only", action="store_true",
                   help="slime's SFT scripts pass it; accepted with --rollout-function-path "
                        "slime.rollout.sft_rollout.generate_rollout only (engines still start here, unused)")

    g = p.add_argument_group("optimizer")
    g.add_argument("--lr", type=float, default=1e-6)
    g.add_argument("--clip-grad", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=1234)
    g.add_argument("--weight-decay", type=float, default=0.0)
    g.add_argument("--adam-beta1", type=float, default=0.9)
    g.add_argument("--adam-beta2", type=float, default=0.999)
    g.add_argument("--adam-eps", type=float, default=1e-8)
    g.add_argument("--lr-warmup-iters", type=int, default=0)
    g.add_argument("--max-tokens-per-gpu", type=int, default=None, help="padded tokens per micro-batch")
    g.add_argument("--micro-batch-size", type=int, default=None, help="samples per micro-batch cap")

    g = p.add_argument_group("lora")
    g.add_argument("--lora-rank", type=int, default=0,
                   help="LoRA rank r: train peft LoRA adapters on the frozen model (torch / fsdp backends); "
                        "0: full fine-tuning")
    g.add_argument("--lora-alpha", type=float, default=16.0, help="LoRA alpha: the update is scaled by alpha / r")
    g.add_argument("--target-modules", default="all-linear",
                   help="modules LoRA adapts: all-linear (q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj) "
                        "or a comma-separated list of module names")
    g.add_argument("--exclude-modules", default=None, help="comma-separated names dropped from --target-modules")
    g.add_argument("--lora-adapter-path", default=None,
                   help="start the adapter from this peft adapter folder (its rank, alpha and targets must match)")
    g.add_argument("--lora-dropout", type=float, default=0.0,
                   help="dropout on the LoRA input while training; keep 0 for on-policy RL (the train step then "
                        "sees another policy than the rollout)")

    g = p.add_argument_group("weight sync")
    g.add_argument("--update-weight-transport", default="disk", choices=["disk", "tensor", "nccl"],
                   help="disk: HF safetensors each engine loads; tensor: /update_weights_from_tensor from the "
                        "trainer's memory (CUDA IPC to colocated SGLang engines, shared memory to CPU engines; "
                        "engines on other nodes and failed syncs fall back to disk); nccl: NCCL broadcast to "
                        "SGLang engines on GPUs of their own")
    g.add_argument("--update-weight-buffer-size", type=int, default=512 * 1024**2,
                   help="bytes per weight-sync bucket (tensor and nccl transports; in the serving dtype)")
    g.add_argument("--update-weight-disk-dir", default=None, help="default: <save or tmp>/weights")
    g.add_argument("--update-weight-disk-keep-files", action="store_true")
    g.add_argument("--update-weights-interval", type=int, default=1)

    g = p.add_argument_group("checkpoints")
    g.add_argument("--load", default=None, help="resume from the latest checkpoint here, if any")
    g.add_argument("--save", default=None)
    g.add_argument("--save-interval", type=int, default=None)
    g.add_argument("--keep-checkpoints", type=int, default=None, metavar="K",
                   help="ours: after each save, delete all but the newest K checkpoints (0 or unset: keep all, as "
                        "upstream); the oldest goes only once the new one is complete")
    g.add_argument("--start-rollout-id", type=int, default=None)

    g = p.add_argument_group("eval")
    g.add_argument("--eval-interval", type=int, default=None)
    g.add_argument("--eval-prompt-data", nargs="+", default=None, help="NAME PATH [NAME PATH ...] or PATH")
    g.add_argument("--n-samples-per-eval-prompt", type=int, default=1)
    g.add_argument("--skip-eval-before-train", action="store_true")
    g.add_argument("--eval-temperature", type=float, default=None)
    g.add_argument("--eval-top-p", type=float, default=None, help="default: --rollout-top-p")
    g.add_argument("--eval-top-k", type=int, default=None, help="default: --rollout-top-k")
    g.add_argument("--eval-max-response-len", type=int, default=None, help="default: --rollout-max-response-len")
    g.add_argument("--eval-max-context-len", type=int, default=None, help="default: --rollout-max-context-len")

    g = p.add_argument_group("fault tolerance")
    g.add_argument("--rollout-health-check-interval", type=float, default=30.0,
                   help="seconds between engine health checks while generating")
    g.add_argument("--rollout-health-check-timeout", type=float, default=30.0)
    g.add_argument("--max-step-retries", type=int, default=3,
                   help="ours: re-generate failed groups of a step this often after engine restarts")

    g = p.add_argument_group("logging")
    g.add_argument("--use-tensorboard", action="store_true")
    g.add_argument("--tensorboard-dir", default=None, help="default: <save>/tensorboard")
    g.add_argument("--use-wandb", action="store_true")
    g.add_argument("--wandb-project", default="slime")
    g.add_argument("--wandb-group", default=None)
    g.add_argument("--wandb-dir", default=None)
    g.add_argument("--wandb-mode", default="offline", choices=["offline", "online", "disabled"])
    g.add_argument("--wandb-key", default=None, help="W&B API key for --wandb-mode online (default: the environment's)")
    g.add_argument("--metrics-path", default=None, help="ours: JSONL metrics (default: <save>/metrics.jsonl)")

    g = p.add_argument_group("ci")
    g.add_argument("--ci-test", action="store_true")
    g.add_argument("--ci-train-rollout-logprob-abs-diff-threshold", type=float, default=0.1)

    for flag in _IGNORED_MEGATRON_FLAGS:
        p.add_argument(flag, nargs="?", const=True, default=None, help=argparse.SUPPRESS)
    for flag, kind in _MEGATRON_MODEL_FLAGS.items():
        if kind is None:
            p.add_argument(flag, action="store_true", default=None, help=argparse.SUPPRESS)
        else:
            p.add_argument(flag, type=kind, default=None, help=argparse.SUPPRESS)
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse flags, apply `--custom-config-path`, fill derived defaults and check consistency."""
    args = build_parser().parse_args(argv)
    if args.custom_config_path:
        apply_custom_config(args, args.custom_config_path)
    finalize_args(args)
    return args


def check_backend(args: argparse.Namespace) -> None:
    """Refuse what no train backend implements instead of silently training something else."""
    for flag in _PARALLEL_SIZE_FLAGS:
        size = getattr(args, flag.lstrip("-").replace("-", "_"))
        if size != 1:
            raise ArgumentError(f"{flag} {size}: model parallelism is not implemented by any --train-backend here "
                                "(megatron runs TP = PP = 1). Use --train-backend fsdp, which shards weights, "
                                "gradients and optimizer state over the train ranks, and leave the flag at 1")
    if args.bf16 and args.train_backend != "fsdp":
        raise ArgumentError(f"--bf16 is implemented by --train-backend fsdp only (bf16 compute, fp32 weights and "
                            f"optimizer); the {args.train_backend} backend trains in fp32. Use --train-backend fsdp "
                            "--bf16, or drop --bf16")


def check_lora_args(args: argparse.Namespace) -> None:
    """The LoRA flags make sense together and with the backend (read with getattr: older namespaces)."""
    rank = getattr(args, "lora_rank", 0) or 0
    if rank < 0:
        raise ArgumentError(f"--lora-rank must be >= 0 (0: full fine-tuning), got {rank}")
    if rank == 0:
        if getattr(args, "lora_adapter_path", None):
            raise ArgumentError("--lora-adapter-path needs --lora-rank > 0 (the adapter's rank)")
        return
    if getattr(args, "train_backend", "torch") == "megatron":
        raise ArgumentError("--lora-rank > 0 is implemented by --train-backend torch and fsdp only (peft adapters on "
                            "the HF model); use one of them, or --lora-rank 0 with megatron")
    alpha, dropout = getattr(args, "lora_alpha", 16.0), getattr(args, "lora_dropout", 0.0)
    if not (math.isfinite(alpha) and alpha > 0):
        raise ArgumentError(f"--lora-alpha must be > 0 and finite, got {alpha}")
    if not 0.0 <= dropout < 1.0:
        raise ArgumentError(f"--lora-dropout must be in [0, 1), got {dropout}")
    from slime.engine.lora_adapters import parse_target_modules

    try:
        parse_target_modules(getattr(args, "target_modules", "all-linear"), getattr(args, "exclude_modules", None))
    except ValueError as exc:
        raise ArgumentError(str(exc)) from None


def apply_custom_config(args: argparse.Namespace, path: str) -> None:
    """setattr every key of the YAML mapping at `path` onto `args` (slime's contract)."""
    try:
        with open(path) as f:
            data: Any = yaml.safe_load(f) or {}
    except OSError as exc:
        raise ArgumentError(f"--custom-config-path {path}: cannot read it ({exc.strerror}); a relative path is "
                            f"read from the working directory") from exc
    if not isinstance(data, dict):
        raise ArgumentError(f"--custom-config-path {path}: expected a YAML mapping, got {type(data).__name__}")
    for key, value in data.items():
        setattr(args, str(key), value)


def finalize_args(args: argparse.Namespace) -> None:
    if args.num_rollout is None and args.num_epoch is None:
        raise ArgumentError("give --num-rollout (training steps) or --num-epoch")
    if args.over_sampling_batch_size is None:
        args.over_sampling_batch_size = args.rollout_batch_size
    if args.over_sampling_batch_size < args.rollout_batch_size:
        raise ArgumentError("--over-sampling-batch-size must be >= --rollout-batch-size")
    if args.rollout_temperature <= 0:
        raise ArgumentError("--rollout-temperature must be > 0 (log-probs are taken at that temperature)")
    if args.use_tis and args.use_rollout_logprobs:
        raise ArgumentError("--use-tis and --use-rollout-logprobs are mutually exclusive")
    if args.kl_loss_coef < 0:
        raise ArgumentError(f"--kl-loss-coef must be >= 0, got {args.kl_loss_coef}")
    # --use-kl-loss with --kl-loss-coef 0 (four of slime's example scripts) is slime's: the KL term has weight 0.
    if not args.compute_advantages_and_returns and args.loss_type != "sft_loss":
        raise ArgumentError("--disable-compute-advantages-and-returns leaves every advantage 0: it needs "
                            "--loss-type sft_loss (policy_loss would learn nothing)")
    if args.debug_train_only and args.rollout_function_path != "slime.rollout.sft_rollout.generate_rollout":
        raise ArgumentError("--debug-train-only (train without generating) needs a rollout that does not generate: "
                            "--rollout-function-path slime.rollout.sft_rollout.generate_rollout; slime's "
                            "--load-debug-rollout-data replay is not here")
    if args.actor_num_nodes * args.actor_num_gpus_per_node < 1:
        raise ArgumentError("--actor-num-nodes x --actor-num-gpus-per-node must be >= 1")
    check_backend(args)
    check_lora_args(args)
    if args.update_weight_transport == "nccl" and args.engine_type != "sglang":
        raise ArgumentError("--update-weight-transport nccl needs --engine-type sglang (the CPU engine loads from disk)")
    if args.update_weight_transport == "tensor" and args.engine_type == "sglang" and not args.colocate:
        raise ArgumentError("--update-weight-transport tensor hands SGLang engines CUDA IPC handles of the trainer's "
                            "GPU memory, which needs --colocate; engines on GPUs of their own take "
                            "--update-weight-transport nccl")
    if args.update_weight_transport == "nccl" and args.colocate:
        raise ArgumentError("--update-weight-transport nccl cannot run with --colocate: a trainer rank and an engine "
                            "on the same GPU cannot both be ranks of one NCCL communicator. Use "
                            "--update-weight-transport disk (the default) with --colocate, or drop --colocate so "
                            "that the engines get GPUs of their own")
    if args.rollout_num_gpus is None:
        args.rollout_num_gpus = args.actor_num_nodes * args.actor_num_gpus_per_node if args.colocate else 1
    # slime: --colocate implies both offloads. The CPU engine shares host memory, not a GPU, so there
    # they stay off unless asked for.
    share_gpu = args.colocate and args.engine_type == "sglang"
    for name in ("offload_train", "offload_rollout"):
        if getattr(args, name) is None:
            setattr(args, name, bool(args.offload or share_gpu))
    if args.offload_rollout and args.update_weights_interval != 1:
        raise ArgumentError("--offload-rollout releases the engines' weights during every train step, so they "
                            "must be re-sent every step: use --update-weights-interval 1")
    if args.engine_type == "sglang" and args.sglang_dtype is None:
        args.sglang_dtype = "bfloat16"  # sglang's "auto" serves a float32 config as float16 (docs/gpu.md)
    if args.rollout_num_gpus % args.rollout_num_gpus_per_engine:
        raise ArgumentError("--rollout-num-gpus must be a multiple of --rollout-num-gpus-per-engine")
    if args.save_interval is not None and not args.save:
        raise ArgumentError("--save-interval needs --save")
    if args.keep_checkpoints is not None and args.keep_checkpoints < 0:
        raise ArgumentError(f"--keep-checkpoints must be >= 0 (0: keep all), got {args.keep_checkpoints}")
    if args.eval_interval is not None and not args.eval_prompt_data:
        raise ArgumentError("--eval-interval needs --eval-prompt-data")
    if args.eval_prompt_data:
        items = args.eval_prompt_data
        if len(items) == 1:
            args.eval_datasets = {"eval": items[0]}
        elif len(items) % 2 == 0:
            args.eval_datasets = dict(zip(items[0::2], items[1::2], strict=True))
        else:
            raise ArgumentError("--eval-prompt-data takes PATH or NAME PATH pairs")
    else:
        args.eval_datasets = {}
    if args.eval_temperature is None:
        args.eval_temperature = args.rollout_temperature
    finalize_upstream_args(args)


def finalize_upstream_args(args: argparse.Namespace) -> None:
    """Defaults and checks of the flags slime's plugins and launch scripts pass (see the module docstring).

    Reads them with getattr: callers may hand a namespace built before these flags existed.
    """
    for name, why in _AWAITING_WIRING.items():
        value = getattr(args, name, None)
        if value is not None and not (name == "data_source_path" and value == DEFAULT_DATA_SOURCE):
            raise ArgumentError(f"--{name.replace('_', '-')} {value}: not supported yet ({why}); leave it out")
    rollout_samples = args.rollout_batch_size * args.n_samples_per_prompt
    steps, gbs = getattr(args, "num_steps_per_rollout", None), getattr(args, "global_batch_size", None)
    if gbs is not None:
        if gbs <= 0 or rollout_samples % gbs:
            raise ArgumentError(f"--global-batch-size {gbs} must divide --rollout-batch-size x --n-samples-per-prompt "
                                f"= {rollout_samples} (the samples of a rollout are split into equal optimizer steps)")
        if steps is not None and steps != rollout_samples // gbs:
            raise ArgumentError(f"--num-steps-per-rollout {steps} and --global-batch-size {gbs} disagree: "
                                f"{rollout_samples} samples per rollout make {rollout_samples // gbs} steps of {gbs}; "
                                "give one of the two")
        steps = rollout_samples // gbs
    steps = 1 if steps is None else steps
    if steps < 1:
        raise ArgumentError(f"--num-steps-per-rollout must be >= 1, got {steps}")
    args.num_steps_per_rollout = steps
    args.global_batch_size = gbs if gbs is not None else max(rollout_samples // steps, 1)
    if getattr(args, "eval_reward_key", None) is None:
        args.eval_reward_key = getattr(args, "reward_key", None)
    if getattr(args, "eval_max_context_len", None) is None:
        args.eval_max_context_len = getattr(args, "rollout_max_context_len", None)
    if getattr(args, "mask_offpolicy_in_partial_rollout", False) and not getattr(args, "partial_rollout", False):
        raise ArgumentError("--mask-offpolicy-in-partial-rollout masks the earlier segments of continued partial "
                            "rollouts: it needs --partial-rollout")
    if args.num_epoch is not None and args.num_rollout is None and not getattr(args, "rollout_global_dataset", True):
        raise ArgumentError("--num-epoch counts passes over --prompt-data, which --disable-rollout-global-dataset "
                            "does not read: give --num-rollout")
    if getattr(args, "rm_type", None) == "remote_rm" and not getattr(args, "rm_url", None):
        raise ArgumentError("--rm-type remote_rm posts each sample to a reward service: give its --rm-url")
    check_opd_args(args)
    dp_size = getattr(args, "sglang_dp_size", None)
    if dp_size is not None and dp_size < 1:
        raise ArgumentError(f"--sglang-dp-size must be >= 1, got {dp_size}")
    if dp_size is not None and dp_size > 1:
        if args.engine_type != "sglang":
            raise ArgumentError(f"--sglang-dp-size {dp_size}: the CPU engine runs one model copy per engine; use "
                                "more engines (--rollout-num-gpus) instead, or --engine-type sglang")
        if not getattr(args, "sglang_enable_dp_attention", None):
            raise ArgumentError(f"--sglang-dp-size {dp_size} is SGLang's data-parallel attention: add "
                                "--sglang-enable-dp-attention")
    if getattr(args, "sglang_enable_deterministic_inference", None) and args.engine_type != "sglang" \
            and args.engine_max_batch_size != 1:
        raise ArgumentError("--sglang-enable-deterministic-inference asks for results that do not depend on which "
                            "requests share a batch; the CPU engine batches requests (its log-probs then differ "
                            "in the last bits): add --engine-max-batch-size 1")


def check_opd_args(args: argparse.Namespace) -> None:
    """On-policy distillation flags as slime reads them; only sglang teachers (a served /generate) are here."""
    opd_type, teacher = getattr(args, "opd_type", None), getattr(args, "opd_teacher_load", None)
    if not getattr(args, "use_opd", False):
        if teacher is not None:
            raise ArgumentError("--opd-teacher-load is set but on-policy distillation is off: add --use-opd")
        return
    if opd_type is None:
        raise ArgumentError("--use-opd needs --opd-type: sglang (a teacher engine at --rm-url scores each sample "
                            "during the rollout)")
    if opd_type == "megatron":
        raise ArgumentError("--opd-type megatron forwards a teacher checkpoint inside the Megatron trainer, which "
                            "this slime does not do: serve the teacher (python -m slime.engine.cpu_server "
                            "--model-path TEACHER, or sglang) and pass --opd-type sglang --rm-url "
                            "http://HOST:PORT/generate --custom-rm-path slime.rollout.on_policy_distillation."
                            "reward_func --custom-reward-post-process-path slime.rollout.on_policy_distillation."
                            "post_process_rewards")
    if teacher is not None:
        raise ArgumentError("--opd-teacher-load is for --opd-type megatron; with --opd-type sglang the teacher is the "
                            "engine at --rm-url: leave --opd-teacher-load out")
    if getattr(args, "advantage_estimator", None) == "ppo":
        raise ArgumentError("--use-opd with --advantage-estimator ppo: the ppo path here does not call "
                            "--custom-reward-post-process-path, which sets the teacher's log-probs; use grpo, gspo, "
                            "cispo, reinforce_plus_plus(_baseline) or rloo")
    if getattr(args, "normalize_advantages", False):
        raise ArgumentError("--use-opd with --normalize-advantages: slime whitens the advantages after adding the "
                            "distillation term, while this trainer whitens them before the term exists (it needs the "
                            "trainer's log-probs); leave --normalize-advantages out")
    coef = getattr(args, "opd_kl_coef", 1.0)
    if not math.isfinite(coef):
        raise ArgumentError(f"--opd-kl-coef must be a finite number, got {coef}")


def serving_dtype(args: argparse.Namespace) -> str:
    """The dtype the rollout engines serve, and so the dtype of every weight sync, export and checkpoint
    model folder meant for them: `--sglang-dtype` for SGLang engines (bfloat16 unless set), `--engine-dtype`
    for the CPU engine (float32 unless set: the trainer's fp32)."""
    if getattr(args, "engine_type", "cpu") == "sglang":
        return args.sglang_dtype or "bfloat16"
    return getattr(args, "engine_dtype", None) or "float32"
