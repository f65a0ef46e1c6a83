r"""The reward hub's built-in rules and their dispatch (`--rm-type`), as upstream slime's plugins use them.

- math_utils: boxed-answer extraction; the MATH-normalised and sympy graders (equivalent forms graded
  equal, wrong or unsafe ones not), `grade_answer_verl`.
- math_dapo_utils.compute_score: its dict, the Minerva "Answer:" rule and the strict `\boxed{}` rule, as
  retool's and strands' reward functions (written here in their style) call it.
- deepscaler, f1, gpqa, ifbench (absent checkers are a clear error).
- async_rm / batched_async_rm: custom paths before rules, metadata rm_type before --rm-type, boxed_ prefix,
  remote_rm against a real HTTP server, errors that name the flag, an empty batch, upstream's bare args.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from slime.rollout import rm_hub
from slime.rollout.rm_hub import math_dapo_utils, math_utils
from slime.rollout.rm_hub.deepscaler import get_deepscaler_rule_based_reward
from slime.rollout.rm_hub.f1 import f1_score
from slime.rollout.rm_hub.gpqa import compute_gpqa_reward
from slime.rollout.rm_hub.ifbench import IFBenchUnavailable, _kwargs_per_instruction, compute_ifbench_reward
from slime.utils.types import Sample

# ------------------------------------------------------------------------------------------- math_utils


@pytest.mark.parametrize(("text", "boxed"), [
    (r"so the answer is \boxed{\frac{1}{2}}.", r"\frac{1}{2}"),
    (r"\boxed{1} first, then \boxed{\{1, 2\}}", r"\{1, 2\}"),
    (r"nested \boxed{\sqrt{\frac{a}{b}}} end", r"\sqrt{\frac{a}{b}}"),
    (r"\fbox{7}", "7"),
    ("no box at all", None),
    (r"\boxed{3", None),
])
def test_extract_answer_takes_the_last_balanced_box(text, boxed):
    assert math_utils.extract_answer(text) == boxed


EQUAL_MATHD = [
    (r"\dfrac12", r"\frac{1}{2}"), ("1/2", r"\frac{1}{2}"), ("0.5", r"\frac12"), (".5", "0.5"),
    (r"3\text{ cm}", "3"), ("x = 3", "3"), (r"90^\circ", "90"), (r"\$5", "5"), (r"50\%", "50"),
    (r"\left(1,2\right)", "(1,2)"), (r"\text{Monday}", "Monday"), (r"\tfrac{3}{4}", "3/4"), (r"\sqrt3", r"\sqrt{3}"),
]


@pytest.mark.parametrize(("given", "truth"), EQUAL_MATHD)
def test_mathd_grades_equal_spellings_equal(given, truth):
    assert math_utils.grade_answer_mathd(given, truth)
    assert math_utils.grade_answer_mathd(truth, given)


@pytest.mark.parametrize(("given", "truth"), [("2/4", r"\frac{1}{2}"), ("4", "3"), ("x = 4", "3"), (r"\frac{1}{3}", "0.5")])
def test_mathd_grades_different_answers_different(given, truth):
    assert not math_utils.grade_answer_mathd(given, truth)


EQUAL_SYMPY = [
    (r"\frac{\sqrt{3}}{2}", r"\sqrt{3}/2"),
    (r"2\pi", r"\pi \cdot 2"),
    ("1,000", "1000"),
    ("1000.0", "1000"),
    (r"(1,\frac{1}{2})", "(1, 0.5)"),
    (r"\frac{x+1}{2}", "(x+1)/2"),
    (r"\frac{1+\sqrt{5}}{2}", r"(1+\sqrt{5})/2"),
    (r"7\frac{3}{4}", "31/4"),
    ("7 3/4", "7.75"),
    (r"x^{2}", "x^2"),
    ("2x", r"2 \times x"),
    (r"\left[1,2\right)", "[1,2)"),
    (r"-\frac{1}{2}", "-0.5"),
    ("3 centimeters", "3"),
    (r"\text{A}", "a"),
    (r"4\sqrt{3}", r"\sqrt{48}"),
    (r"\frac{4}{\sqrt{3}}", r"\frac{4\sqrt{3}}{3}"),
    ("2 or 3", "2, 3"),
]


@pytest.mark.parametrize(("given", "truth"), EQUAL_SYMPY)
def test_sympy_grades_equivalent_expressions_equal(given, truth):
    assert math_utils.grade_answer_sympy(given, truth)


NOT_EQUAL_SYMPY = [
    ("2/4", "1/2"),  # an unreduced fraction is not the answer
    (r"\sqrt{4}", "2"),  # an integer answer must be given as that integer
    ("5!", "120"),
    ("(1,2)", "[1,2]"),  # the brackets of an interval matter
    ("(1,2)", "(1,2,3)"),
    ("x+2", "x+1"),
    (r"1+\frac{\sqrt{5}}{2}", r"\frac{1+\sqrt{5}}{2}"),  # a fraction's numerator is one group
    (r"\binom{5}{2}", "52"),
    ("", "3"),
    ("0.333", r"\frac{1}{3}"),
]


@pytest.mark.parametrize(("given", "truth"), NOT_EQUAL_SYMPY)
def test_sympy_grades_different_answers_different(given, truth):
    assert not math_utils.grade_answer_sympy(given, truth)


@pytest.mark.parametrize("expr", ["(__import__('os'))-(1)", "(9^99)-(1)", "(2^{x})-(1)", "(2^(x+1))-(1)", "(9^9^9)-(1)",
                                  "(99999!)-(1)", "(5!!)-(1)", "(abc)-(1)"])
def test_expressions_sympy_is_never_asked_about(expr):
    assert not math_utils.should_allow_eval(expr)


def test_a_given_answer_is_never_run_as_python(tmp_path):
    marker = tmp_path / "ran"
    code = f"__import__('pathlib').Path({str(marker)!r}).touch()"
    assert not math_utils.grade_answer_sympy(code, "1")
    assert not math_utils.grade_answer_verl(rf"\boxed{{{code}}}", "1")
    assert not marker.exists()


@pytest.mark.parametrize(("latex", "text"), [
    (r"\frac{1}{2}", "1/2"), (r"\frac{1+x}{2}", "(1+x)/2"), (r"\sqrt{2}", "sqrt(2)"), (r"\sqrt[3]{8}", "(8)^(1/(3))"),
    (r"\pi", "pi"), (r"\infty", "inf"), (r"x^{2}", "x^2"), (r"2^{x+1}", "2^(x+1)"), (r"\mathbf{v}", "v"),
    (r"\left( 1, 2 \right)", "( 1, 2 )"), (r"\{1,2\}", "{1,2}"), (r"a \cdot b", "a * b"), (r"\alpha", "α"),
    (r"\frac12", "1/2"), (r"\binom{5}{2}", "binomial(5,2)"), (r"\left.x\right|", "x|"),
])
def test_latex_to_text(latex, text):
    assert math_utils.latex_to_text(latex) == text


@pytest.mark.parametrize("broken", [r"\frac", r"\frac{1}", r"\sqrt"])
def test_latex_missing_an_argument_is_a_value_error(broken):
    with pytest.raises(ValueError):
        math_utils.latex_to_text(broken)


@pytest.mark.parametrize(("response", "label", "right"), [
    (r"... so $x = \boxed{\dfrac{1}{2}}$", "0.5", True),
    (r"\boxed{1/2}", r"The answer is \boxed{\frac12}", True),
    (r"\boxed{3}", 3, True),
    (r"\boxed{3.0}", "3", True),
    (r"\boxed{4}", "3", False),
    ("the answer is 3", "3", False),  # nothing boxed
    (r"\boxed{3}", "", False),
    (r"\boxed{\text{(B)}}", "(B)", True),
])
def test_grade_answer_verl(response, label, right):
    assert math_utils.grade_answer_verl(response, label) is right


def test_upstream_import_paths_of_the_graders():
    from slime.rollout.rm_hub import extract_boxed_answer, grade_answer_verl  # noqa: F401 - geo3k's imports
    from slime.rollout.rm_hub.math_utils import extract_answer

    assert extract_boxed_answer is extract_answer
    assert grade_answer_verl(r"\boxed{2}", "2")


# -------------------------------------------------------------------------------------- math_dapo_utils


@pytest.mark.parametrize(("solution", "truth", "score", "pred"), [
    ("Let me think.\nAnswer: 42", "42", 1.0, "42"),
    ("Answer: $1,000$", "1000", 1.0, "1000"),
    (r"Answer: \boxed{42}", "42.0", 1.0, "42"),
    (r"Answer: 42 \text{ cm}", "42", 1.0, "42"),
    ("Answer: 42 degrees", "42", 1.0, "42"),
    ("Answer: x = 42", "42", 1.0, "42"),
    ("answer : 42", "42", 1.0, "42"),
    ("Answer: 41\nAnswer: 42", "42", 1.0, "42"),  # the last "Answer:" counts
    ("Answer: 41", "42", -1.0, "41"),
    ("the result is 42", "42", -1.0, "[INVALID]"),
    ("Answer: 42" + " padding" * 40, "42", -1.0, "[INVALID]"),  # only the last 300 characters are read
    ("Answer: 0.5", "0.5", 1.0, "0.5"),  # a non-integer truth compares as written (upstream raises)
    ("Answer: 2", "2.5", -1.0, "2"),  # (upstream truncates 2.5 to 2)
])
def test_dapo_minerva_rule(solution, truth, score, pred):
    result = math_dapo_utils.compute_score(solution, truth)
    assert result == {"score": score, "acc": score > 0, "pred": pred}
    assert isinstance(result["score"], float) and isinstance(result["acc"], bool)


@pytest.mark.parametrize(("solution", "truth", "score", "pred"), [
    (r"so Answer: \boxed{42}", "42", 1.0, "42"),
    (r"\boxed{42.0}", "42", -1.0, "42.0"),  # strict: character for character
    (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}", 1.0, r"\frac{1}{2}"),
    (r"\boxed{42}" + "." * 100, "42", -1.0, None),  # the box must be within the last 100 characters
    ("Answer: 42", "42", -1.0, None),
])
def test_dapo_strict_box_rule(solution, truth, score, pred):
    assert math_dapo_utils.compute_score(solution, truth, strict_box_verify=True) == {
        "score": score, "acc": score > 0, "pred": pred}


def test_dapo_pause_tokens_move_the_window():
    short = r"\boxed{42}" + "." * 120  # the box is not within the last 100 characters...
    assert math_dapo_utils.compute_score(short, "42", True, [0, 0, 0, 100])["acc"]  # ...but within 100 before the pause
    assert not math_dapo_utils.compute_score(short, "42", True)["acc"]
    with pytest.raises(ValueError, match="4 positions"):
        math_dapo_utils.compute_score(short, "42", True, [1, 2])


@pytest.mark.parametrize(("raw", "normal"), [
    ("x = 1,234", "1234"), (r"\text{5}", "5"), (r"\textbf{5}", "5"), (r"\overline{12}", "12"), (r"\boxed{7}", "7"),
    (r"\frac12", r"\frac{1}{2}"), (r"\sqrt3", r"\sqrt{3}"), (r"$3$ and $4$", "3"), ("10 dollars", "10"),
    (r"5^\circ", "5"), ("7<|im_end|>", "7"), ("1{,}000", "1000"), ("a 5", "5"),
])
def test_dapo_normalize_final_answer(raw, normal):
    assert math_dapo_utils.normalize_final_answer(raw) == normal


def test_dapo_box_helpers():
    assert math_dapo_utils.last_boxed_only_string(r"a \boxed{1} b \boxed{{2}}") == r"\boxed{{2}}"
    assert math_dapo_utils.last_boxed_only_string(r"\boxed{1") is None
    assert math_dapo_utils.remove_boxed(r"\boxed{{2}}") == "{2}"
    with pytest.raises(ValueError, match=r"\\boxed"):
        math_dapo_utils.remove_boxed("2")
    assert math_dapo_utils.verify("Answer: 7", "7") == (True, "7")
    with pytest.raises(ValueError, match="no .*boxed"):
        math_dapo_utils.is_correct_minerva("Answer: 7", "seven", gt_need_extract=True)
    assert math_dapo_utils.is_correct_minerva("Answer: 7", r"so \boxed{7}", gt_need_extract=True) == (True, "7")


# Reward functions written the way upstream's examples write theirs (retool, strands): our own code.
RETOOL_STYLE_PLUGIN = '''
from slime.rollout.rm_hub.math_dapo_utils import compute_score as math_dapo_compute_score
from slime.utils.types import Sample


async def reward_func(args, sample, **kwargs):
    if not isinstance(sample, Sample):
        raise TypeError("expected a Sample")
    solution_str = sample.prompt + sample.response
    ground_truth = sample.label if sample.label is not None else ""
    num_turns = getattr(sample, "tool_call_count", 0)
    result = math_dapo_compute_score(solution_str, ground_truth, strict_box_verify=True)
    if result["score"] < 0:  # nudge towards calling tools
        result["score"] = min(-0.6, result["score"] + (num_turns - 2) / 2 * 0.1)
    if result["pred"] is None:
        result["pred"] = ""
    return result


async def strands_reward(args, sample, **kwargs):
    result = math_dapo_compute_score(sample.response, sample.label or "", strict_box_verify=False)
    if result["pred"] == "[INVALID]":
        result = math_dapo_compute_score(sample.response, sample.label or "", strict_box_verify=True)
    result["pred"] = result["pred"] or ""
    return result["score"]
'''


@pytest.fixture()
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    module = f"rm_rules_{tmp_path.name.replace('-', '_')}"  # plugin paths are cached: one module per test
    (tmp_path / f"{module}.py").write_text(RETOOL_STYLE_PLUGIN + PLAIN_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield module
    sys.modules.pop(module, None)


PLAIN_PLUGIN = '''

def constant(args, sample, **kwargs):
    return 0.25


async def group_len(args, samples):
    return [float(len(s.response)) for s in samples]


async def generate_boxed(args, sample, sampling_params):
    """A generate function without an engine: it "answers" with the number in its prompt, thinking first."""
    sample.response = "<think>easy</think> so \\\\boxed{" + sample.prompt.split()[-1] + "}"
    sample.tokens, sample.response_length = [1, 2, 3], 2
    sample.status = sample.Status.COMPLETED
    return sample
'''


def _args(**kw: Any) -> argparse.Namespace:
    base = dict(custom_rm_path=None, rm_type=None, reward_key=None, rm_timeout=60.0, group_rm=False)
    return argparse.Namespace(**{**base, **kw})


def _sample(response: str, label: Any = None, prompt: str = "Q: ", index: int = 0, **meta: Any) -> Sample:
    return Sample(index=index, group_index=0, prompt=prompt, response=response, label=label, metadata=dict(meta))


def test_a_retool_style_reward_scores_through_compute_score(plugin):
    args = _args(custom_rm_path=f"{plugin}.reward_func", reward_key="score")
    right = _sample(r"I ran the code. Answer: \boxed{42}", "42")
    assert asyncio.run(rm_hub.async_rm(args, right)) == {"score": 1.0, "acc": True, "pred": "42"}
    wrong = _sample(r"Answer: \boxed{41}", "42")
    wrong.tool_call_count = 0
    assert asyncio.run(rm_hub.async_rm(args, wrong)) == {"score": pytest.approx(-1.1), "acc": False, "pred": "41"}
    unboxed = _sample("Answer: 42", "42")
    unboxed.tool_call_count = 4
    assert asyncio.run(rm_hub.async_rm(args, unboxed)) == {"score": -0.9, "acc": False, "pred": ""}
    with pytest.raises(rm_hub.RewardError, match="--reward-key"):  # the dict needs --reward-key score
        asyncio.run(rm_hub.async_rm(_args(custom_rm_path=f"{plugin}.reward_func"), right))


def test_a_strands_style_reward_falls_back_to_the_strict_rule(plugin):
    args = _args(custom_rm_path=f"{plugin}.strands_reward")
    assert asyncio.run(rm_hub.async_rm(args, _sample("Answer: 42", "42"))) == 1.0
    assert asyncio.run(rm_hub.async_rm(args, _sample(r"so \boxed{42}", "42"))) == 1.0
    assert asyncio.run(rm_hub.async_rm(args, _sample(r"so \boxed{4}", "42"))) == -1.0


# ------------------------------------------------------------------------------------------- deepscaler


@pytest.mark.parametrize(("response", "label", "reward"), [
    (r"<think>maybe \boxed{7}</think>The answer is \boxed{\frac12}.", "0.5", 1),
    (r"<think>it is \boxed{42}</think>I am not sure.", "42", 0),  # a box inside the thinking does not count
    (r"<think>a</think><think>b</think>\boxed{42}", 42, 1),
    (r"<think>a</think>\boxed{42}", 42.0, 1),
    (r"<think>a</think>\boxed{3\text{ cm}}", "3", 1),
    (r"<think>a</think>\boxed{(1, 2)}", "(1,2)", 1),
    (r"<think>a</think>\boxed{x = 3}", r"The answer is \boxed{3}.", 1),
    (r"<think>a</think>\boxed{4}", "3", 0),
    (r"\boxed{42}", "42", 0),  # no thinking separator at all
    (r"###Response \boxed{42}", "42", 1),
    (r"###Response \boxed{41} ###Response \boxed{42}", "42", 0),  # the part after the first marker
    (r"<think>a</think>\boxed{42}", "", 0),
    (r"<think>a</think>\boxed{42}", r"\boxed{4", 0),
])
def test_deepscaler_reward(response, label, reward):
    assert get_deepscaler_rule_based_reward(response, label) == reward


def test_deepscaler_refuses_a_label_it_cannot_read():
    with pytest.raises(TypeError, match="label"):
        get_deepscaler_rule_based_reward(r"</think>\boxed{1}", None)
    assert get_deepscaler_rule_based_reward("</think>no box", None) == 0  # nothing to compare: 0, as upstream


# ----------------------------------------------------------------------------------------------- f1


@pytest.mark.parametrize(("prediction", "truth", "triple"), [
    ("The cat sat.", "the cat sat", (1.0, 1.0, 1.0)),
    ("cat sat on mat", "the cat sat", (pytest.approx(2 / 3), 0.5, 1.0)),
    ("sat sat", "sat", (pytest.approx(2 / 3), 0.5, 1.0)),
    ("Yes!", "yes", (1.0, 1.0, 1.0)),
    ("yes", "no", (0, 0, 0)),
    ("yes it is", "yes", (0, 0, 0)),
    ("dog", "cat", (0, 0, 0)),
    (None, "cat", (0, 0, 0)),
])
def test_f1_score_triples(prediction, truth, triple):
    assert f1_score(prediction, truth) == triple


# ---------------------------------------------------------------------------------------------- gpqa

CITIES = {"choices": ["London", "Paris", "Rome", "Berlin"]}


@pytest.mark.parametrize(("response", "label", "metadata", "reward"), [
    ("The answer is B", "B", None, 1.0),
    ("answer: c", "C", None, 1.0),
    ("B is correct.", "B", None, 1.0),
    ("Final answer: D", "D", CITIES, 1.0),
    ("The answer is A", "B", None, 0.0),
    ("<think>the answer is A</think> I pick (B)", "B", None, 1.0),  # thinking is skipped; last lone capital
    ("The answer is B", 1, CITIES, 1.0),  # an index label
    ("The answer is B", "Paris", CITIES, 1.0),  # a choice's text as the label
    ("Surely Paris.", "Paris", CITIES, 1.0),  # no letter: the right option's text
    ("Surely Rome.", "Paris", CITIES, 0.0),
    ("The answer is B", "A", {"correct_letter": "b"}, 1.0),  # metadata's letter wins over the label
    ("Option D.", "B", {"valid_letters": ["A", "B", "C"]}, 0.0),  # D is not an option here
    ("it is Paris", None, {"correct_answer": "Paris"}, 1.0),
    (None, "B", None, 0.0),
])
def test_gpqa_reward(response, label, metadata, reward):
    assert compute_gpqa_reward(response, label, metadata=metadata) == reward


# -------------------------------------------------------------------------------------------- ifbench


def test_ifbench_without_its_checkers_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "evaluation_lib", None)  # make `import evaluation_lib` fail here
    with pytest.raises(IFBenchUnavailable, match=r"allenai/IFBench.*PYTHONPATH"):
        compute_ifbench_reward("text", None, {"instruction_id_list": ["x"]})
    args = _args(rm_type="ifbench")
    with pytest.raises(IFBenchUnavailable, match="--rm-type ifbench needs"):
        asyncio.run(rm_hub.async_rm(args, _sample("text")))


def test_ifbench_kwargs_are_one_dict_per_instruction():
    assert _kwargs_per_instruction([{"n": 1, "x": None}], 3) == [{"n": 1}, {"n": 1}, {"n": 1}]
    assert _kwargs_per_instruction({"n": 2}, 2) == [{"n": 2}, {"n": 2}]
    assert _kwargs_per_instruction([{"a": 1}, {"b": 2}, {"c": 3}], 2) == [{"a": 1}, {"b": 2}]
    assert _kwargs_per_instruction(None, 1) == [{}]
    assert _kwargs_per_instruction(["junk"], 1) == [{}]


# ------------------------------------------------------------------------------------------- dispatch


@pytest.mark.parametrize(("rm_type", "response", "label", "reward"), [
    ("deepscaler", r"<think>x</think>\boxed{\frac{2}{3}}", "2/3", 1),
    ("deepscaler", r"<think>x</think>\boxed{1}", "2/3", 0),
    ("math", r"so \boxed{0.75}", r"\frac34", 1),
    ("math", "0.75", r"\frac34", 0),
    ("f1", "Paris, France", "paris", pytest.approx(2 / 3)),
    ("boxed_f1", r"I think it is \boxed{Paris} and not France", "paris", 1.0),
    ("boxed_f1", "Paris", "paris", 0),  # nothing boxed: graded as empty
    ("gpqa", "The answer is C", "C", 1.0),
    (" deepscaler ", r"<think>x</think>\boxed{5}", "5", 1),  # surrounding spaces are ignored
])
def test_async_rm_runs_the_rule_of_rm_type(rm_type, response, label, reward):
    assert asyncio.run(rm_hub.async_rm(_args(rm_type=rm_type), _sample(response, label))) == reward


def test_dapo_rule_needs_the_reward_key():
    sample = _sample("Answer: 12", "12")
    assert asyncio.run(rm_hub.async_rm(_args(rm_type="dapo", reward_key="score"), sample)) == {
        "score": 1.0, "acc": True, "pred": "12"}
    with pytest.raises(rm_hub.RewardError, match=r"--rm-type dapo reward of sample 0 .*pass --reward-key"):
        asyncio.run(rm_hub.async_rm(_args(rm_type="dapo"), sample))


def test_metadata_rm_type_wins_over_the_flag_and_paths_win_over_both(plugin):
    sample = _sample(r"<think>x</think>\boxed{2}", "2", rm_type="math")  # math: the last box anywhere
    assert asyncio.run(rm_hub.async_rm(_args(rm_type="f1"), sample)) == 1
    assert asyncio.run(rm_hub.async_rm(_args(rm_type="f1", custom_rm_path=f"{plugin}.constant"), sample)) == 0.25
    sample.custom_rm_path = f"{plugin}.constant"
    assert asyncio.run(rm_hub.async_rm(_args(rm_type="f1"), sample)) == 0.25


def test_random_rule_gives_both_rewards():
    random.seed(0)
    seen = {asyncio.run(rm_hub.async_rm(_args(rm_type="random"), _sample("x"))) for _ in range(40)}
    assert seen == {0, 1}


@pytest.mark.parametrize(("rm_type", "message"), [
    (None, r"no reward function for sample 0 .*--custom-rm-path.*--rm-type .*deepscaler"),
    ("  ", r"no reward function for sample 0 .*--custom-rm-path.*--rm-type"),
    ("exact_match", r"--rm-type 'exact_match' .* is not a built-in reward rule: use one of deepscaler, dapo, math"),
    ("boxed_nope", r"--rm-type 'boxed_nope' .* is not a built-in"),
])
def test_a_missing_or_unknown_rm_type_names_the_flag(rm_type, message):
    with pytest.raises(ValueError, match=message):
        asyncio.run(rm_hub.async_rm(_args(rm_type=rm_type), _sample("x")))


def test_a_metadata_rm_type_that_is_not_a_string_is_named():
    with pytest.raises(ValueError, match="rm_type must be a string"):
        asyncio.run(rm_hub.async_rm(_args(), _sample("x", rm_type=["math"])))


class UpstreamStyleArgs:
    """The bare args upstream's plugin contract tests build, without our parser."""

    rollout_global_dataset = False
    buffer_filter_path = None
    n_samples_per_prompt = 2
    custom_rm_path = None
    group_rm = False
    rm_type = "random"
    reward_key = None


def test_upstream_style_bare_args():
    reward = asyncio.run(rm_hub.async_rm(UpstreamStyleArgs(), _sample("r", "l")))
    rewards = asyncio.run(rm_hub.batched_async_rm(UpstreamStyleArgs(), [_sample("a"), _sample("b", index=1)]))
    assert reward in (0, 1) and len(rewards) == 2 and set(rewards) <= {0, 1}


def test_batched_async_rm(plugin):
    assert asyncio.run(rm_hub.batched_async_rm(_args(rm_type="math"), [])) == []
    assert asyncio.run(rm_hub.batched_async_rm(UpstreamStyleArgs(), [])) == []
    group = [_sample(r"\boxed{3}", "3"), _sample(r"\boxed{4}", "3", index=1),
             _sample("Paris", "paris", index=2, rm_type="f1")]
    assert asyncio.run(rm_hub.batched_async_rm(_args(rm_type="math"), group)) == [1, 0, 1.0]
    assert asyncio.run(rm_hub.batched_async_rm(_args(custom_rm_path=f"{plugin}.group_len"), group)) == [9.0, 9.0, 5.0]
    group[1].metadata["rm_type"] = "nope"
    with pytest.raises(ValueError, match=r"'nope' \(for sample 1 "):
        asyncio.run(rm_hub.batched_async_rm(_args(rm_type="math"), group))


# --------------------------------------------------------------------------------------------- remote_rm


class _RewardService(BaseHTTPRequestHandler):
    """A reward service: the reward is the response's length; the first request of a run fails with a 503."""

    received: list[dict[str, Any]] = []
    fail_next = False

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).received.append(body)
        if type(self).fail_next:
            type(self).fail_next = False
            self.send_response(503)
            self.end_headers()
            return
        reply = json.dumps({"score": float(len(body["response"])), "label_seen": body["label"]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def reward_service() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _RewardService)
    _RewardService.received, _RewardService.fail_next = [], False
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/reward"
    server.shutdown()
    server.server_close()


def test_remote_rm_posts_prompt_response_label(reward_service):
    args = _args(rm_type="remote_rm", rm_url=reward_service, reward_key="score")
    reward = asyncio.run(rm_hub.async_rm(args, _sample("four", "gold", prompt="P")))
    assert reward == {"score": 4.0, "label_seen": "gold"}
    assert _RewardService.received == [{"prompt": "P", "response": "four", "label": "gold"}]
    _RewardService.fail_next = True  # a 5xx is retried
    assert asyncio.run(rm_hub.async_rm(args, _sample("sixsix", "g")))["score"] == 6.0
    assert len(_RewardService.received) == 3


def test_remote_rm_without_a_url_names_the_flag():
    with pytest.raises(ValueError, match="--rm-url"):
        asyncio.run(rm_hub.async_rm(_args(rm_type="remote_rm"), _sample("x")))


# ------------------------------------------------------------------------------------- through the rollout


def _rollout_args(tmp_path: Path, plugin: str, *extra: str) -> argparse.Namespace:
    from slime.arguments import parse_args

    args = parse_args(["--hf-checkpoint", str(tmp_path), "--prompt-data", str(tmp_path / "unused.jsonl"),
                       "--rollout-batch-size", "1", "--num-rollout", "1", "--n-samples-per-prompt", "2",
                       "--custom-generate-function-path", f"{plugin}.generate_boxed", *extra])
    args.rm_type, args.rollout_engine_urls = "deepscaler", ["http://127.0.0.1:1"]  # no request is sent
    return args


def _fresh_generate_state() -> None:
    from slime.rollout.sglang_rollout import GenerateState

    if hasattr(GenerateState, "clear_instances"):
        GenerateState.clear_instances()


@pytest.mark.parametrize("group_rm", [False, True])
def test_the_rollout_scores_with_the_rm_type_rule(tmp_path, plugin, group_rm):
    from slime.rollout import sglang_rollout

    args = _rollout_args(tmp_path, plugin, *(["--group-rm"] if group_rm else []))
    group = [Sample(index=0, group_index=0, prompt="What is 6 * 7? 42", label="42"),
             Sample(index=1, group_index=0, prompt="What is 6 * 7? 41", label="42")]
    _fresh_generate_state()
    try:
        done = asyncio.run(sglang_rollout.generate_and_rm_group(args, group, {}))
    finally:
        _fresh_generate_state()
    assert [s.reward for s in done] == [1, 0]
