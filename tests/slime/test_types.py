"""Sample: segment appends keep per-token lists aligned, statuses map, dumps round-trip."""

from __future__ import annotations

import argparse
import json
import uuid

import pytest

from slime.utils.types import Sample, SampleLengthError, status_from_finish_reason

ARGS = argparse.Namespace()


def test_defaults_match_the_contract():
    sample = Sample()

    assert sample.status is Sample.Status.PENDING
    assert sample.tokens == [] and sample.response == "" and sample.response_length == 0
    assert sample.loss_mask is None and sample.rollout_log_probs is None and sample.reward is None
    assert sample.weight_versions == [] and sample.metadata == {} and sample.remove_sample is False
    assert uuid.UUID(sample.session_id).version == 4
    assert Sample().session_id != sample.session_id
    assert [s.name for s in Sample.Status] == ["PENDING", "COMPLETED", "TRUNCATED", "ABORTED", "FAILED"]


def test_two_turn_example_from_the_reference():
    # prompt [11, 12, 13], model [21, 22], tool observation [31, 32, 33], model [41]
    sample = Sample(prompt="q", tokens=[11, 12, 13])

    sample.append_response_tokens(
        ARGS,
        tokens=[21, 22],
        log_probs=[-0.3, -1.1],
        text="ab",
        meta_info={"finish_reason": {"type": "stop"}, "weight_version": "3"},
    )
    sample.append_response_tokens(ARGS, tokens=[31, 32, 33], trainable=False, text="<obs>")
    sample.append_response_tokens(
        ARGS,
        tokens=[41],
        log_probs=[-0.2],
        text="c",
        meta_info={"finish_reason": {"type": "length"}, "weight_version": 4},
    )

    assert sample.tokens == [11, 12, 13, 21, 22, 31, 32, 33, 41]
    assert sample.response_length == 6
    assert sample.loss_mask == [1, 1, 0, 0, 0, 1]
    assert sample.rollout_log_probs == [-0.3, -1.1, 0.0, 0.0, 0.0, -0.2]
    assert sample.response == "ab<obs>c"
    assert sample.status is Sample.Status.TRUNCATED
    assert sample.weight_versions == ["3", "4"]
    sample.validate()


def test_non_trainable_segment_ignores_given_log_probs():
    sample = Sample(tokens=[1])

    sample.append_response_tokens(ARGS, [5, 6], log_probs=[-1.0, -2.0], trainable=False)

    assert sample.loss_mask == [0, 0] and sample.rollout_log_probs == [0.0, 0.0]


def test_none_loss_mask_means_all_ones_before_appending():
    sample = Sample(tokens=[1, 7, 8], response_length=2, rollout_log_probs=[-0.5, -0.25])

    sample.append_response_tokens(ARGS, [9], trainable=False)

    assert sample.loss_mask == [1, 1, 0]
    assert sample.rollout_log_probs == [-0.5, -0.25, 0.0]


def test_trainable_segment_without_log_probs_is_refused_and_changes_nothing():
    sample = Sample(tokens=[1])

    with pytest.raises(ValueError, match="needs log_probs"):
        sample.append_response_tokens(ARGS, [5, 6])
    with pytest.raises(SampleLengthError, match="2 tokens but 1 log_probs"):
        sample.append_response_tokens(ARGS, [5, 6], log_probs=[-1.0])
    with pytest.raises(ValueError, match="unknown finish_reason"):
        sample.append_response_tokens(
            ARGS, [5], log_probs=[-1.0], meta_info={"finish_reason": {"type": "eos"}}
        )

    assert sample.tokens == [1] and sample.response_length == 0 and sample.loss_mask is None


def test_append_refuses_a_response_without_log_probs():
    sample = Sample(tokens=[1, 2], response_length=1)

    with pytest.raises(SampleLengthError, match="rollout_log_probs is None"):
        sample.append_response_tokens(ARGS, [3], log_probs=[-0.1])


@pytest.mark.parametrize(
    ("reason", "status"),
    [
        ("stop", Sample.Status.COMPLETED),
        ({"type": "length", "length": 512}, Sample.Status.TRUNCATED),
        ({"type": "abort", "message": "aborted"}, Sample.Status.ABORTED),
    ],
)
def test_status_from_finish_reason(reason, status):
    assert status_from_finish_reason(reason) is status


def test_meta_info_without_finish_reason_keeps_status():
    sample = Sample(status=Sample.Status.ABORTED)

    sample.append_response_tokens(ARGS, [4], log_probs=[-0.1], meta_info={"finish_reason": None})

    assert sample.status is Sample.Status.ABORTED and sample.weight_versions == []


def test_validate_names_the_misaligned_list():
    with pytest.raises(SampleLengthError, match=r"len\(loss_mask\)=2 but response_length=3"):
        Sample(index=7, tokens=[1, 2, 3, 4], response_length=3, loss_mask=[1, 1]).validate()
    with pytest.raises(SampleLengthError, match=r"len\(rollout_log_probs\)=1"):
        Sample(tokens=[1, 2], response_length=2, rollout_log_probs=[-1.0]).validate()
    with pytest.raises(SampleLengthError, match="response_length=5"):
        Sample(tokens=[1, 2], response_length=5).validate()


def test_round_trip_through_json():
    sample = Sample(
        group_index=2,
        index=9,
        prompt=[{"role": "user", "content": "hi"}],
        tokens=[1, 2],
        label="4",
        reward={"score": 1.0},
        metadata={"round_number": 3},
    )
    sample.append_response_tokens(ARGS, [3], log_probs=[-0.7], meta_info={"finish_reason": {"type": "stop"}})

    dumped = sample.to_dict()
    restored = Sample.from_dict(json.loads(json.dumps(dumped)))

    assert dumped["status"] == "COMPLETED"
    assert restored == sample
    assert restored.status is Sample.Status.COMPLETED
    restored.tokens.append(99)
    assert sample.tokens == [1, 2, 3]


def test_from_dict_rejects_unknown_keys_and_statuses():
    with pytest.raises(ValueError, match=r"unknown keys \['bogus'\]"):
        Sample.from_dict({"bogus": 1})
    with pytest.raises(ValueError, match="unknown Sample status 'DONE'"):
        Sample.from_dict({"status": "DONE"})
    assert Sample.from_dict({"status": "truncated"}).status is Sample.Status.TRUNCATED


def test_get_reward_value_follows_reward_key():
    sample = Sample(reward={"acc": 1.0, "fmt": 0.5})

    assert sample.get_reward_value(argparse.Namespace(reward_key="fmt")) == 0.5
    assert Sample(reward=0.25).get_reward_value(argparse.Namespace(reward_key=None)) == 0.25
    with pytest.raises(KeyError, match="--reward-key 'len'"):
        sample.get_reward_value(argparse.Namespace(reward_key="len"))
