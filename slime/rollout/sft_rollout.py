"""SFT through the RL loop (slime's `slime.rollout.sft_rollout`): no generation, the dataset's replies are the data.

    --rollout-function-path slime.rollout.sft_rollout.generate_rollout --loss-type sft_loss
    --input-key messages [--loss-mask-type qwen3] [--metadata-key metadata]   (no --apply-chat-template)

Each step takes `--rollout-batch-size` prompt groups of one sample from the data source; a sample's
`prompt` is its conversation (a list of chat messages) and `metadata["tools"]`, when present, the tools
the template lists. `slime.utils.mask_utils.MultiTurnLossMaskGenerator` (`--loss-mask-type`, default
`qwen`) renders it: `tokens` = the whole conversation, `response_length` = from the first learned token
to the end, `loss_mask` = the mask over that tail, `reward` = 0. The trainer's `sft_loss` then learns
the assistant turns only.
"""

from __future__ import annotations

import argparse
import logging
import threading
from typing import Any

from slime.utils.mask_utils import MultiTurnLossMaskGenerator
from slime.utils.types import Sample

__all__ = ["generate_rollout"]

logger = logging.getLogger(__name__)

_LOCK = threading.Lock()
# (hf_checkpoint, loss mask type) -> generator: the tokenizer is loaded and the template measured once.
_GENERATORS: dict[tuple[str, str], MultiTurnLossMaskGenerator] = {}
_LOGGED_EXAMPLE = False


def _generator(args: argparse.Namespace) -> MultiTurnLossMaskGenerator:
    key = (args.hf_checkpoint, getattr(args, "loss_mask_type", None) or "qwen")
    with _LOCK:
        if key not in _GENERATORS:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(key[0], trust_remote_code=True)
            _GENERATORS[key] = MultiTurnLossMaskGenerator(tokenizer, tokenizer_type=key[1])
        return _GENERATORS[key]


def _fill(sample: Sample, generator: MultiTurnLossMaskGenerator) -> None:
    """Set tokens, response_length, loss_mask and reward of one SFT sample from its conversation."""
    messages = sample.prompt
    if isinstance(messages, str):
        raise ValueError(
            f"sft_rollout: sample {sample.index} has a text prompt; SFT needs the conversation itself: point "
            "--input-key at a list of chat messages and leave --apply-chat-template off"
        )
    tools = (sample.metadata or {}).get("tools")
    token_ids, loss_mask = generator.get_loss_mask(messages, tools=tools)
    if len(token_ids) != len(loss_mask):
        raise ValueError(
            f"sft_rollout: sample {sample.index}: {len(token_ids)} tokens but a loss mask of {len(loss_mask)}"
        )
    (response_length,) = generator.get_response_lengths([loss_mask])
    if response_length == 0:  # the trainer leaves samples without response tokens out
        logger.warning("sft_rollout: sample %s has no assistant token to learn (no assistant message, or every "
                       "one has step_loss_mask 0): it is not trained on", sample.index)
    sample.tokens = list(token_ids)
    sample.response_length = response_length
    sample.loss_mask = list(loss_mask[len(loss_mask) - response_length:])
    sample.reward = 0
    sample.status = Sample.Status.COMPLETED


def generate_rollout(
    args: argparse.Namespace, rollout_id: int, data_buffer: Any, evaluation: bool = False
) -> list[list[Sample]]:
    """`--rollout-batch-size` groups (one sample each) of SFT samples drawn from `data_buffer`."""
    global _LOGGED_EXAMPLE
    if evaluation:
        raise ValueError("sft_rollout has no evaluation mode: leave --eval-interval off, or set --eval-function-path")
    if not getattr(args, "rollout_global_dataset", True):
        raise ValueError("sft_rollout draws from the global dataset: drop --disable-rollout-global-dataset")
    generator = _generator(args)
    groups = data_buffer.get_samples(args.rollout_batch_size)
    for group in groups:
        if len(group) != 1:
            raise ValueError(
                f"sft_rollout: a prompt group has {len(group)} samples; SFT takes each conversation once: "
                "set --n-samples-per-prompt 1"
            )
        _fill(group[0], generator)
    if groups and not _LOGGED_EXAMPLE:
        first = groups[0][0]
        logger.info("sft_rollout example (step %d): %d tokens, %d trained on; learned text: %r", rollout_id,
                    len(first.tokens), sum(first.loss_mask),
                    generator.get_text_from_loss_mask(first.tokens[-first.response_length:], first.loss_mask))
        _LOGGED_EXAMPLE = True
    return groups
