"""The recipe's knobs (key, environment variable, target) and the auto-profiles' defaults.

Targets: `--flag` is a `python -m slime.train` flag (bool knobs: the flag is passed when true);
`yaml:awm_x` is a key of the runtime YAML given as `--custom-config-path` (the rollout, reward and
traces read `args.awm_x`); `launcher` is used by `awm_grpo.launch` itself (the doc says how).
Resolution and precedence live in `awm_grpo.launch.config`; this file is data only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from awm_grpo.recovery.credit import CreditConfig
from awm_grpo.recovery.judge import JudgeConfig

REPO = Path(__file__).resolve().parents[2]
RUNS = "runs/awm_grpo"
CPU_BASE_MODEL = f"{RUNS}/models/base"  # slime.models.tiny, built by setup.sh
CPU_WARM_MODEL = f"{RUNS}/models/warmstart"  # awm_grpo.warmstart on the reference solutions, if run
GPU_MODEL = "runs/models/Qwen3-4B"  # setup.sh's MODEL_DIR default
GPU_DATA = "runs/data/awm1k"  # setup.sh's AWM-1K download folder


@dataclass(frozen=True)
class Knob:
    key: str  # section.name in config.yaml
    env: str  # environment variable
    kind: str  # int | float | bool | str | path | list | dict
    target: str  # --slime-flag | yaml:awm_key | launcher
    doc: str
    nullable: bool = False
    choices: tuple[str, ...] = ()
    alias: str = ""  # a second variable name (slime's own), read when the first is not set


@dataclass(frozen=True)
class Derived:
    """A default computed from other knobs: fn(get, gpus) -> value; `text` is shown as its source."""

    fn: Callable[[Callable[[str], Any], list], Any]
    text: str


SECTIONS = {  # config.yaml's sections, in order, with the comment on their line
    "paths": "", "hardware": "",
    "data": "the prompts: data_prep's splits (written when missing) or prompt files",
    "training": "", "optimizer": "", "grpo": "", "inference": "",
    "environment": "the awm_* keys of the runtime YAML (--custom-config-path) the rollout reads",
    "context": "StateLM's context management (awm_grpo.context): memory tools, a context budget, samples",
    "recovery": "implicit recovery learning (docs/recovery-method.md)", "logging": "",
}

K = Knob
KNOBS: tuple[Knob, ...] = (
    K("paths.hf_checkpoint", "HF_CKPT", "path", "--hf-checkpoint", "HF model folder: policy init, tokenizer, engine"),
    K("paths.ref_checkpoint", "REF_CKPT", "path", "--ref-load", "reference model of the KL loss"),
    K("paths.save_dir", "SAVE_DIR", "path", "--save", "checkpoints, metrics.jsonl, tensorboard, runtime YAML"),
    K("paths.resume_checkpoint", "RESUME_CKPT", "path", "--load", "resume from the latest checkpoint here, if any"),
    K("paths.splits_dir", "AWM_SPLITS_DIR", "path", "launcher",
      "train/val/test.jsonl (--prompt-data, --eval-prompt-data val); written by data_prep if missing; unused "
      "when data.prompt_file is set"),
    K("paths.trace_dir", "AWM_TRACE_DIR", "path", "yaml:awm_trace_dir", "one JSONL record per trajectory"),
    K("hardware.profile", "AWM_PROFILE", "str", "launcher", "auto-profile: picks every `auto` default",
      choices=("cpu", "a100-40gb", "h100", "h200")),
    K("hardware.num_gpus", "NUM_GPUS", "int", "--num-gpus-per-node",
      "GPUs of this machine (auto: nvidia-smi); derives rollout_num_gpus, checked against train + rollout"),
    K("hardware.train_num_gpus", "TRAIN_NUM_GPUS", "int", "--actor-num-gpus-per-node",
      "GPUs of the trainer per trainer node: one data-parallel rank each (FSDP2 shards the model over all of "
      "them)", alias="ACTOR_NUM_GPUS_PER_NODE"),
    K("hardware.actor_num_nodes", "ACTOR_NUM_NODES", "int", "--actor-num-nodes",
      "nodes of the trainer (multi-node: ranks = actor_num_nodes x train_num_gpus, over the Ray cluster)"),
    K("hardware.rollout_num_gpus", "ROLLOUT_NUM_GPUS", "int", "--rollout-num-gpus", "GPUs of the engines"),
    K("hardware.rollout_num_gpus_per_engine", "ROLLOUT_NUM_GPUS_PER_ENGINE", "int", "--rollout-num-gpus-per-engine",
      "tensor parallelism of one engine"),
    K("hardware.colocate", "COLOCATE", "bool", "--colocate",
      "trainer and engines share GPUs (engines release their memory while the trainer trains, the trainer "
      "moves to host memory while they generate)"),
    K("hardware.ray_num_cpus", "RAY_NUM_CPUS", "int", "--ray-num-cpus", "logical CPUs of the local Ray cluster"),
    K("hardware.ray_address", "RAY_ADDRESS", "str", "--ray-address",
      "join this Ray cluster (HEAD_IP:6379, started with `ray start --head`) instead of starting a local one; "
      "null: a local single-machine cluster (docs/recipe.md, Multi-node)", nullable=True),
    K("data.split_by", "AWM_SPLIT_BY", "str", "launcher", "data_prep --split-by when splits are written",
      choices=("scenario", "task")),
    K("data.split_seed", "AWM_SPLIT_SEED", "int", "launcher", "data_prep --seed"),
    K("data.max_scenarios", "AWM_MAX_SCENARIOS", "int", "launcher", "data_prep --max-scenarios", nullable=True),
    K("data.exclude_file", "AWM_EXCLUDE_FILE", "path", "launcher", "data_prep --exclude (an audit file)",
      nullable=True),
    K("data.task_mix", "AWM_TASK_MIX", "str", "launcher",
      "data_prep --task-mix: training prompts natural (R1), state-mutating tasks twice (R2) or only (R3); "
      "val/test unchanged", choices=("natural", "mutating_2x", "mutating_only")),
    K("data.prompt_file", "PROMPT_FILE", "path", "launcher",
      "training prompts (--prompt-data) from this JSONL or .parquet file instead of the splits (FILE@[a:b]: "
      "rows a..b-1); its first row tells the layout: the recipe's {text, metadata} (data_prep's rows: chat "
      "template applied) or StateLM's {prompt, reward_model, document_content, extra_info} "
      "(awm_grpo.context.docqa: --input-key prompt --label-key reward_model --metadata-key extra_info "
      "--extra-metadata-keys document_content [data_source, when the row has one], no chat template); null: "
      "the splits' train.jsonl", nullable=True),
    K("data.eval_prompt_file", "EVAL_PROMPT_FILE", "path", "launcher",
      "eval prompts (--eval-prompt-data val FILE), JSONL or .parquet, in the training prompts' layout; "
      "null: the splits' val.jsonl, or no eval when data.prompt_file is set", nullable=True),
    K("training.num_rollout", "NUM_ROLLOUT", "int", "--num-rollout", "training steps (rollout + train)"),
    K("training.async", "ASYNC", "bool", "launcher",
      "one step off-policy: run python -m slime.train_async (step k+1's rollout is generated with step k's "
      "weights while step k trains) instead of slime.train; needs colocate false"),
    K("training.rollout_batch_size", "ROLLOUT_BATCH_SIZE", "int", "--rollout-batch-size", "prompts per step"),
    K("training.n_samples_per_prompt", "N_SAMPLES_PER_PROMPT", "int", "--n-samples-per-prompt", "GRPO group size"),
    K("training.over_sampling_batch_size", "OVER_SAMPLING_BATCH_SIZE", "int", "--over-sampling-batch-size",
      "prompts generated per round before the dynamic filter (adaptive: at most this many at a time)"),
    K("training.over_sampling_policy", "OVER_SAMPLING_POLICY", "str", "--over-sampling-policy",
      "eager (slime's: a whole over-sampling batch whenever the batch cannot be made) | adaptive (only the groups "
      "the batch lacks at the dynamic filter's pass rate, +1: fewer episodes played and aborted)",
      choices=("eager", "adaptive")),
    K("training.global_batch_size", "GLOBAL_BATCH_SIZE", "int", "--num-steps-per-rollout",
      "samples per optimizer step; passed as steps = batch x n / global"),
    K("training.max_tokens_per_gpu", "MAX_TOKENS_PER_GPU", "int", "--max-tokens-per-gpu", "tokens per micro-batch"),
    K("training.train_backend", "TRAIN_BACKEND", "str", "--train-backend",
      "torch (replicated) | fsdp (FSDP2 sharding) | megatron (megatron-core model, TP = PP = 1)",
      choices=("torch", "fsdp", "megatron")),
    K("training.bf16", "BF16", "bool", "--bf16", "bf16 compute with fp32 weights and optimizer (fsdp backend)"),
    K("training.recompute_granularity", "RECOMPUTE_GRANULARITY", "str", "--recompute-granularity",
      "full: gradient checkpointing; selective: LM-head chunks only; null: keep activations (Qwen3-4B does not "
      "fit one GPU without full, measured)", nullable=True,
      choices=("full", "selective")),
    K("training.lora_rank", "LORA_RANK", "int", "--lora-rank",
      "LoRA rank r: train peft adapters on the frozen model and sync only them to the engines; 0: full "
      "fine-tuning (torch / fsdp backends)"),
    K("training.lora_alpha", "LORA_ALPHA", "float", "--lora-alpha", "LoRA alpha: updates scaled by alpha / r"),
    K("training.lora_target_modules", "LORA_TARGET_MODULES", "str", "--target-modules",
      "modules LoRA adapts: all-linear (q, k, v, o, gate, up, down projections) or a comma-separated list"),
    K("training.lora_dropout", "LORA_DROPOUT", "float", "--lora-dropout",
      "dropout on the LoRA input while training (0 keeps the train step on the rollout's policy)"),
    K("training.dynamic_sampling_filter", "DYNAMIC_SAMPLING_FILTER_PATH", "str", "--dynamic-sampling-filter-path",
      "group filter (null: keep every group)", nullable=True),
    K("training.save_interval", "SAVE_INTERVAL", "int", "--save-interval", "steps between checkpoints"),
    K("training.keep_checkpoints", "KEEP_CHECKPOINTS", "int", "--keep-checkpoints",
      "checkpoints kept: after each save all but the newest K are deleted, once the new one is complete (0: keep "
      "all); the launcher sizes the disk for K + 1 (docs/gpu.md, Checkpoints and disk)"),
    K("training.eval_interval", "EVAL_INTERVAL", "int", "--eval-interval", "steps between evals on val"),
    K("training.n_samples_per_eval_prompt", "N_SAMPLES_PER_EVAL_PROMPT", "int", "--n-samples-per-eval-prompt",
      "samples per val prompt"),
    K("training.skip_eval_before_train", "SKIP_EVAL_BEFORE_TRAIN", "bool", "--skip-eval-before-train",
      "no eval of the starting policy"),
    K("training.seed", "TRAIN_SEED", "int", "--seed", "trainer seed; also --rollout-seed (and --engine-seed on CPU)"),
    K("optimizer.lr", "LR", "float", "--lr", "learning rate (constant)"),
    K("optimizer.weight_decay", "WEIGHT_DECAY", "float", "--weight-decay", "AdamW weight decay"),
    K("optimizer.adam_beta1", "ADAM_BETA1", "float", "--adam-beta1", "AdamW beta1"),
    K("optimizer.adam_beta2", "ADAM_BETA2", "float", "--adam-beta2", "AdamW beta2"),
    K("optimizer.clip_grad", "CLIP_GRAD", "float", "--clip-grad", "gradient norm clip"),
    K("grpo.advantage_estimator", "ADVANTAGE_ESTIMATOR", "str", "--advantage-estimator", "grpo, gspo, rloo, ..."),
    K("grpo.kl_loss_coef", "KL_LOSS_COEF", "float", "--kl-loss-coef", "KL to the reference; > 0 adds --use-kl-loss"),
    K("grpo.kl_loss_type", "KL_LOSS_TYPE", "str", "--kl-loss-type", "k1 | k2 | k3 | low_var_kl"),
    K("grpo.eps_clip", "EPS_CLIP", "float", "--eps-clip", "PPO clip (low side)"),
    K("grpo.eps_clip_high", "EPS_CLIP_HIGH", "float", "--eps-clip-high", "DAPO clip-higher"),
    K("grpo.entropy_coef", "ENTROPY_COEF", "float", "--entropy-coef", "entropy bonus"),
    K("grpo.use_tis", "USE_TIS", "bool", "--use-tis",
      "truncated importance sampling: weight each token by exp(lp_old - lp_rollout) (clipped), correcting for "
      "samples generated by older weights (training.async) or a mismatching engine"),
    K("inference.engine_type", "AWM_ENGINE_TYPE", "str", "--engine-type", "cpu (slime's CPU engine) | sglang",
      choices=("cpu", "sglang")),
    K("inference.max_response_len", "ROLLOUT_MAX_RESPONSE_LEN", "int", "--rollout-max-response-len",
      "response budget of a trajectory (model + observation tokens)"),
    K("inference.max_context_len", "ROLLOUT_MAX_CONTEXT_LEN", "int", "--rollout-max-context-len",
      "prompt + response cap", nullable=True),
    K("inference.temperature", "ROLLOUT_TEMPERATURE", "float", "--rollout-temperature", "sampling temperature"),
    K("inference.eval_temperature", "EVAL_TEMPERATURE", "float", "--eval-temperature",
      "eval temperature (null: the rollout temperature)", nullable=True),
    K("inference.sglang_mem_fraction_static", "SGLANG_MEM_FRACTION_STATIC", "float", "--sglang-mem-fraction-static",
      "share of GPU memory SGLang holds for weights + KV cache (sglang engine only; null: SGLang's own; "
      "docs/gpu.md has the arithmetic)", nullable=True),
    K("inference.sglang_dtype", "SGLANG_DTYPE", "str", "--sglang-dtype",
      "what every SGLang engine serves, passed as its --dtype on every start and restart; exports and "
      "checkpoints for engines are written in it (sglang engine only)",
      choices=("bfloat16", "float16", "float32")),
    K("inference.update_weight_transport", "UPDATE_WEIGHT_TRANSPORT", "str", "--update-weight-transport",
      "how engines get the trainer's weights each step: tensor (from the trainer's memory by "
      "/update_weights_from_tensor: CUDA IPC to colocated SGLang engines, shared memory to CPU engines; "
      "falls back to disk, logged, where it cannot), disk (HF safetensors), nccl (SGLang engines on GPUs "
      "of their own)", choices=("tensor", "disk", "nccl")),
    K("inference.sglang_server_concurrency", "SGLANG_SERVER_CONCURRENCY", "int", "--sglang-server-concurrency",
      "concurrent requests per engine"),
    K("inference.engine_max_batch_size", "ENGINE_MAX_BATCH_SIZE", "int", "--engine-max-batch-size",
      "CPU engine batch cap (cpu engine only)"),
    K("environment.data_dir", "AWM_DATA_DIR", "path", "yaml:awm_data_dir", "AWM-1K folder (null: bundled)",
      nullable=True),
    K("environment.transport", "AWM_TRANSPORT", "str", "yaml:awm_transport", "inprocess | mcp",
      choices=("inprocess", "mcp")),
    K("environment.mcp_urls", "AWM_MCP_URLS", "list", "yaml:awm_mcp_urls",
      "base URLs of `awm env start` servers (comma-separated in the variable)"),
    K("environment.mcp_servers", "AWM_MCP_SERVERS", "int", "launcher",
      "with transport mcp and no urls: local `awm env start` servers the launcher starts and stops"),
    K("environment.tool_mode", "AWM_TOOL_MODE", "str", "yaml:awm_tool_mode", "meta (list_tools/call_tool) | native",
      choices=("meta", "native")),
    K("environment.calls_per_turn", "AWM_CALLS_PER_TURN", "str", "yaml:awm_calls_per_turn", "first | all",
      choices=("first", "all")),
    K("environment.max_turns", "AWM_MAX_TURNS", "int", "yaml:awm_max_turns", "model turns per episode"),
    K("environment.turn_schedule", "AWM_TURN_SCHEDULE", "dict", "yaml:awm_turn_schedule",
      'null (fixed max_turns) or {"rounds": [10, 20, 30], "every": 100}', nullable=True),
    K("environment.agentgym_envs", "AWM_AGENTGYM_ENVS", "dict", "yaml:awm_agentgym_envs",
      'AgentGym-protocol environments for prompt rows with metadata {"agentgym": {"env", "data_idx"}} '
      '(awm_grpo.agentgym.client): {"babyai": {"urls": ["http://127.0.0.1:36001"], "finish_action": null, '
      '"instruction": null}}; null: AWM environments only', nullable=True),
    K("environment.max_tokens_per_turn", "AWM_MAX_TOKENS_PER_TURN", "int", "yaml:awm_max_tokens_per_turn",
      "cap on one model turn (null: the remaining budget)", nullable=True),
    K("environment.history_window_turns", "AWM_HISTORY_WINDOW_TURNS", "int", "yaml:awm_history_window_turns",
      "B1's sliding window: past this many model turns the engine sees the task + the last K turns, and each such "
      "turn trains as its own sample (needs credit_method b1); null: the full history", nullable=True),
    K("environment.max_observation_tokens", "AWM_MAX_OBSERVATION_TOKENS", "int", "yaml:awm_max_observation_tokens",
      "cap on one tool result (truncated with a marker); the tool catalogue (list_tools) is never cut"),
    K("environment.invalid_call_penalty", "AWM_INVALID_CALL_PENALTY", "float", "yaml:awm_invalid_call_penalty",
      "reward added for an invalid tool call"),
    K("environment.terminate_on_invalid_call", "AWM_TERMINATE_ON_INVALID_CALL", "bool",
      "yaml:awm_terminate_on_invalid_call", "end the episode at an invalid call"),
    K("environment.max_repeated_calls", "AWM_MAX_REPEATED_CALLS", "int", "yaml:awm_max_repeated_calls",
      "identical calls in a row that end the episode"),
    K("environment.tool_timeout", "AWM_TOOL_TIMEOUT", "float", "yaml:awm_tool_timeout", "seconds per tool call"),
    K("environment.verifier_timeout", "AWM_VERIFIER_TIMEOUT", "float", "yaml:awm_verifier_timeout",
      "seconds per verifier run"),
    K("environment.env_workers", "AWM_ENV_WORKERS", "int", "yaml:awm_env_workers",
      "environment worker processes (inprocess) / per started MCP server"),
    K("environment.drift_workers", "AWM_DRIFT_WORKERS", "int", "yaml:awm_drift_workers",
      "processes that run the end-of-episode drift check (the chat template re-rendered, the model's text "
      "re-encoded) off the rollout driver's core; 0: in the driver"),
    K("environment.enable_thinking", "AWM_ENABLE_THINKING", "bool", "yaml:awm_enable_thinking",
      "Qwen3 thinking mode in the chat template"),
    K("environment.reward_complete", "AWM_REWARD_COMPLETE", "float", "yaml:awm_reward_complete",
      "reward of a complete verdict"),
    K("environment.reward_partial", "AWM_REWARD_PARTIAL", "float", "yaml:awm_reward_partial",
      "reward when the verifier reports partial completion"),
    K("environment.reward_other", "AWM_REWARD_OTHER", "float", "yaml:awm_reward_other", "reward of other verdicts"),
    K("environment.reward_doc_correct", "AWM_REWARD_DOC_CORRECT", "float", "yaml:awm_reward_doc_correct",
      "document-QA rows (awm_grpo.context.docqa): reward of a correct finish(answer) (StateLM's +1)"),
    K("environment.reward_doc_wrong", "AWM_REWARD_DOC_WRONG", "float", "yaml:awm_reward_doc_wrong",
      "document-QA rows: reward of a wrong finish(answer) (StateLM's -0.5)"),
    K("environment.reward_doc_none", "AWM_REWARD_DOC_NONE", "float", "yaml:awm_reward_doc_none",
      "document-QA rows: reward of no finish call (a plain reply, or the budget or turn limit first; StateLM's -1)"),
    K("context.tools", "AWM_CONTEXT_TOOLS", "bool", "yaml:awm_context_tools",
      "StateLM's memory tools (checkBudget, note, readNote, updateNote, deleteContext) beside the "
      "environment's; a document row brings the document tools. On (or context.limit set): the "
      "context-managed rollout (--custom-generate-function-path awm_grpo.context.loop.generate, "
      "--calculate-per-token-loss); not with environment.history_window_turns, recovery.predicates, "
      "recovery.credit_method or recovery.judge_url"),
    K("context.limit", "AWM_CONTEXT_LIMIT", "int", "yaml:awm_context_limit",
      "tokens the engine's context may hold in a context-managed episode; context + reserve past it ends the "
      "episode (stop context_budget). Set: the context-managed rollout, as context.tools; null: "
      "inference.max_context_len when context.tools is on", nullable=True),
    K("context.reserve", "AWM_CONTEXT_RESERVE", "int", "yaml:awm_context_reserve",
      "tokens of context.limit kept for the next model turn (its new-token cap); limit > reserve > 0"),
    K("context.samples", "AWM_CONTEXT_SAMPLES", "str", "yaml:awm_context_samples",
      "how a context-managed episode becomes samples: snapshot (StateLM's generic mode: a deletion closes a "
      "sample, the history re-rendered with stubs starts the next) or per_turn (every tool turn its own "
      "sample)", choices=("snapshot", "per_turn")),
    K("context.max_samples", "AWM_CONTEXT_MAX_SAMPLES", "int", "yaml:awm_context_max_samples",
      "samples kept per context-managed episode: the last and max_samples - 1 of the others drawn at random "
      "(seeded); >= 1"),
    K("recovery.predicates", "AWM_PREDICATES", "path", "yaml:awm_predicates",
      "predicates JSONL (`awm predicates build --out F`): per-turn progress in rollouts, traces and metrics",
      nullable=True),
    K("recovery.credit_method", "AWM_CREDIT_METHOD", "str", "yaml:awm_credit_method",
      "null: slime's own advantages; else awm_grpo.recovery.advantages with this method (b2, b2plus, ours and "
      "traj_agg need predicates; b2plus also the judge)", nullable=True,
      choices=("b1", "b2", "b2plus", "ours", "traj_agg")),
    K("recovery.credit_lambda", "AWM_CREDIT_LAMBDA", "float", "yaml:awm_credit_lambda", "progress weight lambda"),
    K("recovery.credit_beta", "AWM_CREDIT_BETA", "float", "yaml:awm_credit_beta", "verification bonus beta"),
    K("recovery.credit_eta", "AWM_CREDIT_ETA", "float", "yaml:awm_credit_eta", "turn discount eta"),
    K("recovery.credit_gamma_v", "AWM_CREDIT_GAMMA_V", "float", "yaml:awm_credit_gamma_v",
      "weight of the verification bonus"),
    K("recovery.credit_progress_form", "AWM_CREDIT_PROGRESS_FORM", "str", "yaml:awm_credit_progress_form",
      "difference: Phi_t - Phi_{t-1} after writes; potential: eta Phi_t - Phi_{t-1} on every turn (ablation)",
      choices=("difference", "potential")),
    K("recovery.credit_estimator", "AWM_CREDIT_ESTIMATOR", "str", "yaml:awm_credit_estimator",
      "carry: carry + leave-one-out; naive: per-turn-index pools (biased, ablation)", choices=("carry", "naive")),
    K("recovery.credit_baseline", "AWM_CREDIT_BASELINE", "str", "yaml:awm_credit_baseline",
      "carry estimator's baseline: loo (leave-one-out) or mean (includes the sample)", choices=("loo", "mean")),
    K("recovery.credit_scale", "AWM_CREDIT_SCALE", "str", "yaml:awm_credit_scale",
      "carry estimator's scale: null (none: raw returns minus baseline) or group_std (divided by the std of the "
      "group's episode returns)", nullable=True, choices=("group_std",)),
    K("recovery.credit_binary_only", "AWM_CREDIT_BINARY_ONLY", "bool", "yaml:awm_credit_binary_only",
      "a scalar predicate counts 1 only when met exactly (ablation S1)"),
    K("recovery.judge_url", "AWM_JUDGE_URL", "str", "yaml:awm_judge_url",
      "B2+: base URL of an OpenAI-compatible endpoint (http://HOST:PORT/v1) whose model scores each tool call; "
      "null: no judge", nullable=True),
    K("recovery.judge_model", "AWM_JUDGE_MODEL", "str", "yaml:awm_judge_model", "B2+: the judge's model name",
      nullable=True),
    K("recovery.judge_api_key_env", "AWM_JUDGE_API_KEY_ENV", "str", "yaml:awm_judge_api_key_env",
      "B2+: the environment variable that holds the judge's API key (unset: no key sent)"),
    K("recovery.judge_concurrency", "AWM_JUDGE_CONCURRENCY", "int", "yaml:awm_judge_concurrency",
      "B2+: judge requests in flight per rollout process"),
    K("recovery.judge_timeout", "AWM_JUDGE_TIMEOUT", "float", "yaml:awm_judge_timeout",
      "B2+: seconds per judge request (then retried; a judge that never answers fails the episode as infra)"),
    K("recovery.judge_retries", "AWM_JUDGE_RETRIES", "int", "yaml:awm_judge_retries",
      "B2+: retries of a failed judge request"),
    K("logging.tensorboard", "USE_TENSORBOARD", "bool", "--use-tensorboard", "tensorboard under save_dir"),
    K("logging.wandb_enabled", "WANDB_ENABLED", "bool", "--use-wandb", "log to wandb (key: WANDB_API_KEY)"),
    K("logging.wandb_project", "WANDB_PROJECT", "str", "--wandb-project", "wandb project"),
    K("logging.wandb_group", "WANDB_GROUP", "str", "--wandb-group", "wandb group", nullable=True),
    K("logging.wandb_mode", "WANDB_MODE", "str", "--wandb-mode", "offline | online | disabled",
      choices=("offline", "online", "disabled")),
)


def _data_name(get: Callable[[str], Any]) -> str:
    data = get("environment.data_dir")
    return "bundled" if data is None else Path(data).name


def _cpu_model(get: Callable[[str], Any], gpus: list) -> str:
    return CPU_WARM_MODEL if (REPO / CPU_WARM_MODEL / "config.json").is_file() else CPU_BASE_MODEL


SAME_AS = {  # derived defaults shared by every profile
    "paths.ref_checkpoint": Derived(lambda get, g: get("paths.hf_checkpoint"), "= paths.hf_checkpoint"),
    "paths.resume_checkpoint": Derived(lambda get, g: get("paths.save_dir"), "= paths.save_dir"),
    "paths.trace_dir": Derived(lambda get, g: str(Path(get("paths.save_dir")) / "traces"), "= save_dir/traces"),
    "paths.splits_dir": Derived(lambda get, g: f"{RUNS}/splits/{_data_name(get)}",
                                f"{RUNS}/splits/<bundled | data_dir name>"),
    "training.global_batch_size": Derived(
        lambda get, g: get("training.rollout_batch_size") * get("training.n_samples_per_prompt"),
        "= rollout_batch_size x n_samples_per_prompt (one optimizer step per rollout)"),
}

PROFILES: dict[str, dict[str, Any]] = {
    # Shared by all profiles (GPU numbers of the reference recipe, Qwen3-4B on AWM-1K).
    "base": {
        **SAME_AS,
        "paths.hf_checkpoint": GPU_MODEL,
        "paths.save_dir": Derived(lambda get, g: f"{RUNS}/{get('hardware.profile')}", f"{RUNS}/<profile>"),
        "hardware.num_gpus": Derived(lambda get, gpus: len(gpus), "nvidia-smi GPU count"),
        "hardware.train_num_gpus": Derived(
            lambda get, g: max(get("hardware.num_gpus"), 1) if get("hardware.colocate")
            else max(get("hardware.num_gpus") // 2, 1),
            "colocate: = num_gpus (every GPU trains and generates); else half of them"),
        "hardware.rollout_num_gpus": Derived(
            lambda get, g: get("hardware.train_num_gpus") if get("hardware.colocate")
            else max(get("hardware.num_gpus") - get("hardware.train_num_gpus"), 1),
            "colocate: = train_num_gpus; else num_gpus - train_num_gpus"),
        "hardware.rollout_num_gpus_per_engine": 1,
        # async generates while it trains, so trainer and engines need GPUs of their own
        "hardware.colocate": Derived(lambda get, g: not get("training.async"), "true (false when training.async)"),
        "hardware.ray_num_cpus": 8, "hardware.ray_address": None, "hardware.actor_num_nodes": 1,
        "data.split_by": "scenario", "data.split_seed": 42, "data.max_scenarios": None, "data.exclude_file": None,
        "data.task_mix": "natural", "data.prompt_file": None, "data.eval_prompt_file": None,
        "training.num_rollout": 200, "training.async": False,
        # Prompts a step per GPU that generates (docs/gpu.md has the arithmetic): one H200
        # engine holds about 64 episodes of this recipe in its KV cache, and a step's rollout lasts as
        # long as its longest episode (~100 s of decoding) however few run, so 32 prompts x 4 samples
        # = 128 episodes per GPU fill it; 8 GPUs run 1,024 episodes a step, as the AWM paper trains.
        "training.rollout_batch_size": Derived(lambda get, g: 32 * get("hardware.rollout_num_gpus"),
                                               "= 32 x rollout_num_gpus"),
        "training.n_samples_per_prompt": 4,
        "training.over_sampling_batch_size": Derived(lambda get, g: 2 * get("training.rollout_batch_size"),
                                                     "= 2 x rollout_batch_size"),
        # the profiles' engines admit about one batch of episodes: eager's extra groups queue and are most of a
        # second wave, aborted once the batch is full (benchmarks/gpu_twin.py: 2x the turns generated)
        "training.over_sampling_policy": "adaptive",
        "training.max_tokens_per_gpu": Derived(lambda get, g: get("inference.max_response_len"),
                                               "= inference.max_response_len"),
        "training.dynamic_sampling_filter": "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std",
        # Qwen3-4B on one H200, measured (benchmarks/gpu_train_memory.py, 8192 tokens a micro-batch):
        # no recompute runs out of memory (>134 GiB); fsdp + bf16 + full recompute peaks at 63 GiB in
        # 1.1 s a step (fp32 torch backend: 65 GiB, 7.3 s). Colocated engines release their memory
        # meanwhile (--offload-rollout, on under --colocate).
        "training.train_backend": "fsdp", "training.bf16": True, "training.recompute_granularity": "full",
        # One GPU trains LoRA adapters (docs/lora.md): Qwen3-4B's full training state (fp32 master weights,
        # AdamW moments: ~63 GiB at the step's peak) would leave the colocated engines little room, and a
        # 40 GB card cannot hold it at all; with adapters the base is frozen (no gradients, no moments), the
        # KL reference is the base itself (adapters switched off, no second copy) and each weight sync moves
        # the adapter (~130 MB at r 32 in bf16) instead of the model (~8 GB). Two or more GPUs: full fine-tuning.
        "training.lora_rank": Derived(lambda get, g: 32 if get("hardware.num_gpus") == 1 else 0,
                                      "one GPU: 32 (LoRA); else 0 (full fine-tuning)"),
        "training.lora_alpha": Derived(lambda get, g: 2.0 * get("training.lora_rank") if get("training.lora_rank")
                                       else 16.0, "2 x lora_rank (updates x 2); 16 when lora_rank is 0"),
        "training.lora_target_modules": "all-linear",
        "training.lora_dropout": 0.0,
        "training.save_interval": 10, "training.keep_checkpoints": 2, "training.eval_interval": 10,
        "training.n_samples_per_eval_prompt": 1,
        "training.skip_eval_before_train": True, "training.seed": 1234,
        # LoRA's best rate is commonly ~10x full fine-tuning's (adapters start at zero, move through a product)
        "optimizer.lr": Derived(lambda get, g: 1e-5 if get("training.lora_rank") else 1e-6,
                                "1e-6; 1e-5 with LoRA (lora_rank > 0)"),
        "optimizer.weight_decay": 0.1, "optimizer.adam_beta1": 0.9,
        "optimizer.adam_beta2": 0.98, "optimizer.clip_grad": 1.0,
        "grpo.advantage_estimator": "grpo", "grpo.kl_loss_coef": 0.001, "grpo.kl_loss_type": "low_var_kl",
        "grpo.eps_clip": 0.2, "grpo.eps_clip_high": 0.28, "grpo.entropy_coef": 0.0,
        "grpo.use_tis": False,
        "inference.engine_type": "sglang", "inference.max_response_len": 16384, "inference.max_context_len": None,
        "inference.temperature": 1.0, "inference.eval_temperature": None,
        # SGLang's static pool (weights + KV cache) as a share of GPU memory. Colocated, the trainer sits in
        # host memory while engines generate (0.06 GiB left on the GPU, measured), so the rest only holds
        # SGLang's activations, CUDA graphs and the processes' CUDA contexts: 0.7, as upstream slime's
        # colocated Qwen3-4B recipe; engines on GPUs of their own take 0.85. docs/gpu.md, KV arithmetic.
        "inference.sglang_mem_fraction_static": Derived(
            lambda get, g: 0.7 if get("hardware.colocate") else 0.85, "colocate: 0.7; else 0.85"),
        "inference.sglang_dtype": "bfloat16",
        # tensor where the engines share the trainer's memory: on CPU (benchmarks/weight_sync_cpu.py, 241M
        # parameters) it beat disk in both runs, bf16 0.6 / 1.9 s against 1.3 / 2.7 s; failures fall back to disk.
        "inference.update_weight_transport": Derived(
            lambda get, g: "tensor" if get("hardware.colocate") or get("inference.engine_type") == "cpu" else "disk",
            "tensor when colocated or on CPU engines; else disk"),
        # Episodes in flight per engine (the rollout's semaphore covers a whole episode): about what the
        # KV cache holds, 0.7 x 150.8 GB - 8 GB weights = ~97 GB / 144 KiB a token = ~660k tokens, ~130
        # episodes at 5k tokens of context: every episode of a step's 128 per GPU. SGLang queues the rest.
        "inference.sglang_server_concurrency": 128,
        "inference.engine_max_batch_size": 64,
        "environment.data_dir": GPU_DATA, "environment.transport": "inprocess", "environment.mcp_urls": [],
        "environment.mcp_servers": 1, "environment.tool_mode": "meta", "environment.calls_per_turn": "first",
        "environment.max_turns": 15, "environment.turn_schedule": None, "environment.agentgym_envs": None, "environment.max_tokens_per_turn": None, "environment.history_window_turns": None,
        "environment.max_observation_tokens": 2048, "environment.invalid_call_penalty": -1.0,
        "environment.terminate_on_invalid_call": False, "environment.max_repeated_calls": 3,
        "environment.tool_timeout": 30.0, "environment.verifier_timeout": 30.0, "environment.env_workers": 8,
        "environment.drift_workers": 2,  # a third of the driver's CPU an episode (docs/performance.md)
        "environment.enable_thinking": True, "environment.reward_complete": 1.0,
        "environment.reward_partial": 0.1, "environment.reward_other": 0.0, "environment.reward_doc_correct": 1.0,
        "environment.reward_doc_wrong": -0.5, "environment.reward_doc_none": -1.0,
        # off by default; reserve and max_samples as StateLM's Qwen3 scripts run (2,048 tokens a turn,
        # 8 samples an episode); its 32k context limit is context.limit's to set (null: max_context_len)
        "context.tools": False, "context.limit": None, "context.reserve": 2048, "context.samples": "snapshot",
        "context.max_samples": 8,
        "recovery.predicates": None, "recovery.credit_method": None, "recovery.credit_lambda": CreditConfig.lam,
        "recovery.credit_beta": CreditConfig.beta, "recovery.credit_eta": CreditConfig.eta,  # the method's home
        "recovery.credit_gamma_v": CreditConfig.gamma_v, "recovery.credit_progress_form": CreditConfig.progress_form,
        "recovery.credit_estimator": CreditConfig.estimator, "recovery.credit_baseline": CreditConfig.baseline,
        "recovery.credit_scale": None if CreditConfig.scale == "none" else CreditConfig.scale,
        "recovery.judge_url": None, "recovery.judge_model": None, "recovery.judge_api_key_env": JudgeConfig.api_key_env,
        "recovery.judge_concurrency": JudgeConfig.concurrency, "recovery.judge_timeout": JudgeConfig.timeout_s,
        "recovery.judge_retries": JudgeConfig.retries, "recovery.credit_binary_only": CreditConfig.binary_only,
        "logging.tensorboard": True, "logging.wandb_enabled": False, "logging.wandb_project": "awm-grpo",
        "logging.wandb_group": None, "logging.wandb_mode": "offline",
    },
    "h200": {},  # >= 120 GiB: the base numbers
    # KV cache: 0.7 x 85.5 GB - 8 GB weights = ~52 GB = ~350k tokens = ~70 episodes of ~5k tokens;
    # 16 prompts x 4 samples = 64 episodes per GPU, all in flight: 256 a step on 4 GPUs, 512 on 8.
    "h100": {"training.rollout_batch_size": Derived(lambda get, g: 16 * get("hardware.rollout_num_gpus"),
                                                    "= 16 x rollout_num_gpus"),
             "inference.max_response_len": 8192, "inference.sglang_server_concurrency": 64},
    "a100-40gb": {"training.rollout_batch_size": 2, "inference.max_response_len": 4096,
                  "inference.sglang_server_concurrency": 2,
                  "environment.enable_thinking": False, "environment.max_observation_tokens": 1024},
    # The embedded default: bundled scenarios, a small local model, slime's CPU engine, 2 cores.
    "cpu": {
        "paths.hf_checkpoint": Derived(_cpu_model, f"{CPU_WARM_MODEL} if setup.sh ran the warm start, "
                                                   f"else {CPU_BASE_MODEL}"),
        "hardware.num_gpus": 0, "hardware.train_num_gpus": 1, "hardware.rollout_num_gpus": 1,
        "hardware.colocate": False,
        "data.split_by": "task",  # six scenarios: held-out tasks, not held-out scenarios
        "training.num_rollout": 20, "training.rollout_batch_size": 4, "training.n_samples_per_prompt": 4,
        "training.over_sampling_batch_size": Derived(lambda get, g: get("training.rollout_batch_size"),
                                                     "= rollout_batch_size"),
        "training.over_sampling_policy": "eager",
        "training.max_tokens_per_gpu": 4096,
        "training.train_backend": "torch", "training.bf16": False, "training.recompute_granularity": None,
        # falls back to zero-variance groups instead of sampling forever when every reward is equal
        "training.dynamic_sampling_filter":
            "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std_with_fallback",
        "training.save_interval": 5, "training.eval_interval": 5, "training.skip_eval_before_train": False,
        "optimizer.lr": 1e-5, "optimizer.weight_decay": 0.0,
        "grpo.kl_loss_coef": 0.0,
        "inference.engine_type": "cpu", "inference.max_response_len": 2048, "inference.engine_max_batch_size": 16,
        # every episode of a step at once: one decode step of the CPU engine costs about the same for 8 or 16
        "inference.sglang_server_concurrency": Derived(
            lambda get, g: get("training.rollout_batch_size") * get("training.n_samples_per_prompt"),
            "= rollout_batch_size x n_samples_per_prompt"),
        "environment.data_dir": None, "environment.max_turns": 8, "environment.max_tokens_per_turn": 128,
        "environment.max_observation_tokens": 256, "environment.env_workers": 1, "environment.drift_workers": 0,
        "environment.enable_thinking": False, "environment.tool_timeout": 10.0, "environment.verifier_timeout": 10.0,
    },
}

# Values above these warn: they are what the profile's hardware is sized for.
BUDGETS: dict[str, dict[str, float]] = {
    "h200": {"inference.max_response_len": 16384, "training.max_tokens_per_gpu": 16384,
             "inference.sglang_mem_fraction_static": 0.85, "inference.sglang_server_concurrency": 128,
             "training.rollout_batch_size": 256},  # 8 GPUs' worth: past it steps grow longer, not memory
    "h100": {"inference.max_response_len": 8192, "training.max_tokens_per_gpu": 8192,
             "inference.sglang_mem_fraction_static": 0.85, "inference.sglang_server_concurrency": 64,
             "training.rollout_batch_size": 128},
    "a100-40gb": {"inference.max_response_len": 4096, "training.max_tokens_per_gpu": 4096,
                  "inference.sglang_mem_fraction_static": 0.85, "inference.sglang_server_concurrency": 2,
                  "training.rollout_batch_size": 2},
    "cpu": {"inference.max_response_len": 4096, "training.rollout_batch_size": 8,
            "training.n_samples_per_prompt": 8, "environment.env_workers": 2},
}
