"""Command-line flags of `python -m slime.train`, spelled as slime spells them.

Launch scripts written for slime run unchanged as far as the flags below go; flags this trainer
does not implement are rejected with a message (argparse), not silently ignored, except Megatron's
parallelism and architecture flags, which are accepted and ignored as slime's own parser does.
Every key of the YAML given by `--custom-config-path` is `setattr` onto `args` (plugins read them).

Supported slime flags, by group (defaults are slime's unless marked "ours"):

- cluster: --actor-num-nodes, --actor-num-gpus-per-node, --num-gpus-per-node, --rollout-num-gpus,
  --rollout-num-gpus-per-engine, --colocate, --train-backend (torch only here)
- model: --hf-checkpoint, --model-name, --ref-load
- data: --prompt-data, --input-key, --label-key, --metadata-key, --apply-chat-template,
  --apply-chat-template-kwargs, --rollout-shuffle, --rollout-seed, --num-rollout, --num-epoch
- rollout: --rollout-batch-size, --n-samples-per-prompt, --over-sampling-batch-size,
  --rollout-temperature, --rollout-top-p, --rollout-top-k, --rollout-max-response-len,
  --rollout-max-prompt-len, --rollout-max-context-len, --rollout-stop, --rollout-stop-token-ids, --rollout-skip-special-tokens,
  --sglang-server-concurrency, --sglang-router-ip, --sglang-router-port
- plugins: --rollout-function-path (train rollouts; eval always uses the built-in),
  --custom-generate-function-path, --custom-rm-path, --group-rm, --reward-key,
  --dynamic-sampling-filter-path, --custom-config-path
- algorithm: --advantage-estimator (grpo, gspo, cispo), --eps-clip, --eps-clip-high, --eps-clip-c,
  --use-kl-loss, --kl-loss-coef, --kl-loss-type, --use-unbiased-kl, --entropy-coef,
  --disable-rewards-normalization, --disable-grpo-std-normalization, --calculate-per-token-loss,
  --use-tis, --tis-clip, --tis-clip-low, --use-rollout-logprobs, --num-steps-per-rollout
- optimizer: --lr, --clip-grad, --seed, --weight-decay, --adam-beta1, --adam-beta2,
  --lr-warmup-iters, --max-tokens-per-gpu, --micro-batch-size (caps samples per micro-batch)
- weights: --update-weight-transport (disk), --update-weight-disk-dir, --update-weight-disk-keep-files,
  --update-weights-interval
- checkpoints: --load, --save, --save-interval, --start-rollout-id
- eval: --eval-interval, --eval-prompt-data, --n-samples-per-eval-prompt, --skip-eval-before-train,
  --eval-temperature (ours, default: the rollout temperature)
- fault tolerance: --rollout-health-check-interval, --rollout-health-check-timeout,
  --max-step-retries (ours)
- logging: --use-tensorboard, --tensorboard-dir, --use-wandb, --wandb-project, --wandb-group,
  --wandb-dir, --wandb-mode (offline by default here), --metrics-path (ours: JSONL, one line a step)
- CI: --ci-test, --ci-train-rollout-logprob-abs-diff-threshold
- ours for CPU: --engine-type (cpu), --ray-address, --ray-num-cpus, --engine-max-batch-size,
  --engine-seed

Not implemented: --eval-function-path, --data-source-path, --buffer-filter-path (the buffer uses
`pop_first`), sample filters, hooks, --rm-type built-ins, --partial-rollout, critic/PPO, SFT loss,
async training (train_async.py), NCCL / tensor weight transport, data parallelism over several
train actors.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

import yaml

# Megatron flags that launch scripts commonly pass; slime's parser ignores what it does not use.
_IGNORED_MEGATRON_FLAGS = (
    "--tensor-model-parallel-size",
    "--pipeline-model-parallel-size",
    "--context-parallel-size",
    "--expert-model-parallel-size",
    "--expert-tensor-parallel-size",
    "--optimizer",
    "--bf16",
    "--sequence-parallel",
    "--use-dynamic-batch-size",
    "--recompute-granularity",
    "--recompute-method",
    "--recompute-num-layers",
    "--attention-dropout",
    "--hidden-dropout",
    "--accumulate-allreduce-grads-in-fp32",
    "--attention-softmax-in-fp32",
    "--attention-backend",
    "--lr-decay-style",
)


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
                   help="train actors per node (this backend runs one train actor)")
    g.add_argument("--num-gpus-per-node", type=int, default=8)
    g.add_argument("--rollout-num-gpus", type=int, default=None,
                   help="devices for engines (default: 1 engine; = actor devices under --colocate)")
    g.add_argument("--rollout-num-gpus-per-engine", type=int, default=1)
    g.add_argument("--colocate", action="store_true", help="train actor and engines share bundles")
    g.add_argument("--train-backend", default="torch", choices=["torch"])
    g.add_argument("--engine-type", default="cpu", choices=["cpu"],
                   help="ours: rollout engine implementation")
    g.add_argument("--engine-max-batch-size", type=int, default=64, help="ours: CPU engine batch cap")
    g.add_argument("--engine-seed", type=int, default=0, help="ours: CPU engine sampling seed")
    g.add_argument("--ray-address", default=None, help="ours: join this Ray cluster instead of starting one")
    g.add_argument("--ray-num-cpus", type=int, default=8,
                   help="ours: logical CPUs of the local Ray cluster (may exceed the real cores)")

    g = p.add_argument_group("model")
    g.add_argument("--hf-checkpoint", required=True, help="HF model folder: tokenizer, engine and trainer init")
    g.add_argument("--model-name", default=None)
    g.add_argument("--ref-load", default=None, help="reference model folder for the KL loss (default: --hf-checkpoint)")

    g = p.add_argument_group("data")
    g.add_argument("--prompt-data", required=True, help="JSONL file of prompts")
    g.add_argument("--input-key", default="input")
    g.add_argument("--label-key", default=None)
    g.add_argument("--metadata-key", default="metadata")
    g.add_argument("--apply-chat-template", action="store_true")
    g.add_argument("--apply-chat-template-kwargs", type=json.loads, default={})
    g.add_argument("--rollout-shuffle", action="store_true")
    g.add_argument("--rollout-seed", type=int, default=42)
    g.add_argument("--num-rollout", type=int, default=None, help="training steps (or use --num-epoch)")
    g.add_argument("--num-epoch", type=int, default=None)

    g = p.add_argument_group("rollout")
    g.add_argument("--rollout-batch-size", type=int, required=True, help="prompts (groups) per step")
    g.add_argument("--n-samples-per-prompt", type=int, default=1)
    g.add_argument("--over-sampling-batch-size", type=int, default=None)
    g.add_argument("--rollout-temperature", type=float, default=1.0)
    g.add_argument("--rollout-top-p", type=float, default=1.0)
    g.add_argument("--rollout-top-k", type=int, default=-1)
    g.add_argument("--rollout-max-response-len", type=int, default=None)
    g.add_argument("--rollout-max-prompt-len", type=int, default=None)
    g.add_argument("--rollout-max-context-len", type=int, default=None)
    g.add_argument("--rollout-stop", nargs="+", default=None)
    g.add_argument("--rollout-stop-token-ids", type=int, nargs="+", default=None)
    g.add_argument("--rollout-skip-special-tokens", action="store_true")
    g.add_argument("--sglang-server-concurrency", type=int, default=512)
    g.add_argument("--sglang-router-ip", default=None, help="set by the trainer to the engine it starts")
    g.add_argument("--sglang-router-port", type=int, default=None)

    g = p.add_argument_group("plugins")
    g.add_argument("--rollout-function-path", default="slime.rollout.sglang_rollout.generate_rollout",
                   help="fn(args, rollout_id, data_source, evaluation=False) -> RolloutFnTrainOutput "
                        "(or legacy list[list[Sample]]); sync or async")
    g.add_argument("--custom-generate-function-path", default=None)
    g.add_argument("--custom-rm-path", default=None)
    g.add_argument("--group-rm", action="store_true")
    g.add_argument("--reward-key", default=None)
    g.add_argument("--dynamic-sampling-filter-path", default=None)
    g.add_argument("--custom-config-path", default=None, help="YAML whose keys become attributes of args")

    g = p.add_argument_group("algorithm")
    g.add_argument("--advantage-estimator", default="grpo", choices=["grpo", "gspo", "cispo"])
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
    g.add_argument("--num-steps-per-rollout", type=int, default=1, help="optimizer steps per rollout")

    g = p.add_argument_group("optimizer")
    g.add_argument("--lr", type=float, default=1e-6)
    g.add_argument("--clip-grad", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=1234)
    g.add_argument("--weight-decay", type=float, default=0.0)
    g.add_argument("--adam-beta1", type=float, default=0.9)
    g.add_argument("--adam-beta2", type=float, default=0.999)
    g.add_argument("--lr-warmup-iters", type=int, default=0)
    g.add_argument("--max-tokens-per-gpu", type=int, default=None, help="padded tokens per micro-batch")
    g.add_argument("--micro-batch-size", type=int, default=None, help="samples per micro-batch cap")

    g = p.add_argument_group("weight sync")
    g.add_argument("--update-weight-transport", default="disk", choices=["disk"])
    g.add_argument("--update-weight-disk-dir", default=None, help="default: <save or tmp>/weights")
    g.add_argument("--update-weight-disk-keep-files", action="store_true")
    g.add_argument("--update-weights-interval", type=int, default=1)

    g = p.add_argument_group("checkpoints")
    g.add_argument("--load", default=None, help="resume from the latest checkpoint here, if any")
    g.add_argument("--save", default=None)
    g.add_argument("--save-interval", type=int, default=None)
    g.add_argument("--start-rollout-id", type=int, default=None)

    g = p.add_argument_group("eval")
    g.add_argument("--eval-interval", type=int, default=None)
    g.add_argument("--eval-prompt-data", nargs="+", default=None, help="NAME PATH [NAME PATH ...] or PATH")
    g.add_argument("--n-samples-per-eval-prompt", type=int, default=1)
    g.add_argument("--skip-eval-before-train", action="store_true")
    g.add_argument("--eval-temperature", type=float, default=None)

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
    g.add_argument("--metrics-path", default=None, help="ours: JSONL metrics (default: <save>/metrics.jsonl)")

    g = p.add_argument_group("ci")
    g.add_argument("--ci-test", action="store_true")
    g.add_argument("--ci-train-rollout-logprob-abs-diff-threshold", type=float, default=0.1)

    for flag in _IGNORED_MEGATRON_FLAGS:
        p.add_argument(flag, nargs="?", const=True, default=None, help=argparse.SUPPRESS)
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse flags, apply `--custom-config-path`, fill derived defaults and check consistency."""
    args = build_parser().parse_args(argv)
    if args.custom_config_path:
        apply_custom_config(args, args.custom_config_path)
    finalize_args(args)
    return args


def apply_custom_config(args: argparse.Namespace, path: str) -> None:
    """setattr every key of the YAML mapping at `path` onto `args` (slime's contract)."""
    with open(path) as f:
        data: Any = yaml.safe_load(f) or {}
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
    if args.use_kl_loss and args.kl_loss_coef == 0.0:
        raise ArgumentError("--use-kl-loss needs a non-zero --kl-loss-coef")
    if args.actor_num_nodes * args.actor_num_gpus_per_node != 1:
        raise ArgumentError(
            "the torch backend trains in one actor: use --actor-num-nodes 1 --actor-num-gpus-per-node 1 "
            "(data parallelism is not implemented)"
        )
    if args.rollout_num_gpus is None:
        args.rollout_num_gpus = args.actor_num_nodes * args.actor_num_gpus_per_node if args.colocate else 1
    if args.rollout_num_gpus % args.rollout_num_gpus_per_engine:
        raise ArgumentError("--rollout-num-gpus must be a multiple of --rollout-num-gpus-per-engine")
    if args.save_interval is not None and not args.save:
        raise ArgumentError("--save-interval needs --save")
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
