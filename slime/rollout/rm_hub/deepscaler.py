r"""DeepScaleR's rule reward (`--rm-type deepscaler`): 1 when the boxed answer after the thinking is right.

The answer is read only after the reasoning: after the last `</think>`, or after the first `###Response`
(up to any second one). A response with neither, with no `\boxed{}` there, or an empty label scores 0.
The label may be a number, a plain answer or a solution with its own `\boxed{}`; grading is
`math_utils.grade_answer_mathd` or `math_utils.grade_answer_sympy`.
"""

from __future__ import annotations

from slime.rollout.rm_hub.math_utils import extract_answer, grade_answer_mathd, grade_answer_sympy


def _final_part(response: str) -> str | None:
    if "</think>" in response:
        return response.rpartition("</think>")[2]
    if "###Response" in response:
        return response.split("###Response")[1]
    return None


def get_deepscaler_rule_based_reward(response: str, label: str | float | int) -> int:
    """1 when the response's final boxed answer matches `label`, else 0 (see the module docstring)."""
    final = _final_part(response or "")
    given = None if final is None else extract_answer(final)
    if given is None or label == "":
        return 0
    if not isinstance(label, str | float | int):
        raise TypeError(f"the deepscaler reward needs a str, int or float label, got {type(label).__name__} "
                        f"{label!r}: set the dataset's label (--label-key) to the answer")
    truth: str | None = str(label)
    if "\\boxed" in truth:
        truth = extract_answer(truth)
        if truth is None:
            return 0
    return int(grade_answer_mathd(given, truth) or grade_answer_sympy(given, truth))
