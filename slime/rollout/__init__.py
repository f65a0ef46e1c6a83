"""slime's rollout package, laid out as slime's import paths (docs/trainer.md, slime's contracts):

- `slime.rollout.sglang_rollout`: `GenerateState`, `generate`, `generate_and_rm`,
  `generate_and_rm_group`, `generate_rollout` (the default rollout function), `get_model_url`; ours:
  `play_rollout` (its coroutine), `engine_url`, `check_generated`
- `slime.rollout.base_types`: `RolloutFnTrainOutput`, `RolloutFnEvalOutput`, `call_rollout_fn`
- `slime.rollout.data_source`: `DataSource`, `RolloutDataSource`, `RolloutDataSourceWithBuffer`, `pop_first`
- `slime.rollout.filter_hub.base_types.DynamicFilterOutput`,
  `slime.rollout.filter_hub.dynamic_sampling_filters`
- `slime.rollout.rm_hub`: `async_rm`, `batched_async_rm`

The names below are re-exported so that `from slime.rollout import ...` keeps working.
"""

from slime.rollout.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput, call_rollout_fn
from slime.rollout.data_source import (
    DataSource,
    Prompt,
    PromptDataSource,
    RolloutDataSource,
    RolloutDataSourceWithBuffer,
    load_prompts,
    pop_first,
)
from slime.rollout.filter_hub.base_types import DynamicFilterOutput
from slime.rollout.filter_hub.dynamic_sampling_filters import (
    check_reward_nonzero_std,
    check_reward_nonzero_std_with_fallback,
)
from slime.rollout.rm_hub import async_rm, batched_async_rm
from slime.rollout.sglang_rollout import (
    GenerateState,
    PluginContractError,
    RolloutFailedError,
    check_generated,
    engine_url,
    eval_metrics,
    eval_prompts,
    eval_rollout,
    generate,
    generate_and_rm,
    generate_and_rm_group,
    generate_rollout,
    get_model_url,
    play_rollout,
    sampling_params_from_args,
)

__all__ = [
    "DataSource", "DynamicFilterOutput", "GenerateState", "PluginContractError", "Prompt", "PromptDataSource",
    "RolloutDataSource", "RolloutDataSourceWithBuffer", "RolloutFailedError", "check_generated", "engine_url",
    "play_rollout", "RolloutFnEvalOutput", "RolloutFnTrainOutput",
    "async_rm", "batched_async_rm", "call_rollout_fn", "check_reward_nonzero_std",
    "check_reward_nonzero_std_with_fallback", "eval_metrics", "eval_prompts", "eval_rollout", "generate", "generate_and_rm",
    "generate_and_rm_group", "generate_rollout", "get_model_url", "load_prompts", "pop_first",
    "sampling_params_from_args",
]
