r"""DAPO's math reward (`--rm-type dapo`, and plugins' `compute_score`): +1 for a right answer, -1 otherwise.

`compute_score(solution_str, ground_truth, strict_box_verify=False, pause_tokens_index=None)` returns a dict
`{"score": 1.0 | -1.0, "acc": bool, "pred": str | None}`; train on it with `--reward-key score`. Only the last
300 characters of the solution are read (the longest MATH-500 answer is far shorter). Two ways to read the
answer:

- default (Minerva): the text after the last "Answer:" on its line, normalised (`normalize_final_answer`:
  units, `\text{}`, `\boxed{}`, `$`, thousands commas dropped) and compared with the normalised ground truth,
  which DAPO's data holds as an integer ("42", "42.0"); `pred` is "[INVALID]" when there is no "Answer:".
- `strict_box_verify=True`: the last `\boxed{...}` within the last 100 characters (or within 100 characters
  before the last pause token) must equal the ground truth exactly, character for character.
"""

from __future__ import annotations

import re
import signal
import threading
from types import FrameType, TracebackType

INVALID_PRED = "[INVALID]"


def last_boxed_only_string(string: str) -> str | None:
    r"""The last `\boxed{...}` of `string`, braces balanced; None when there is none or it never closes."""
    start = string.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    for i in range(start + len("\\boxed"), len(string)):
        depth += {"{": 1, "}": -1}.get(string[i], 0)
        if depth == 0:
            return string[start:i + 1]
    return None


def remove_boxed(s: str) -> str:
    r"""The content of `\boxed{content}`; ValueError for any other string."""
    if not (s.startswith("\\boxed{") and s.endswith("}")):
        raise ValueError(f"expected a string of the form \\boxed{{...}}, got {s!r}")
    return s[len("\\boxed{"):-1]


class timeout:  # noqa: N801 - upstream's name
    """`with timeout(seconds):` raises TimeoutError (with `error_message`) when the block runs longer.

    Uses SIGALRM, so it works only in the main thread of the main interpreter (whole seconds)."""

    def __init__(self, seconds: int = 1, error_message: str = "Timeout") -> None:
        self.seconds, self.error_message = seconds, error_message

    def handle_timeout(self, signum: int, frame: FrameType | None) -> None:
        raise TimeoutError(self.error_message)

    def __enter__(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("math_dapo_utils.timeout uses SIGALRM and works only in the main thread")
        signal.signal(signal.SIGALRM, self.handle_timeout)
        signal.alarm(self.seconds)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        signal.alarm(0)


# Plain replacements, in order: articles, dollar signs, spaces, `\mbox` as `\text`, "and" in lists.
_REPLACEMENTS = (
    ("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
    (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"),
)
# Words of units and objects that MATH answers carry along with the number.
_UNIT_WORDS = (
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue", "points",
    "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals", "edges",
    "students", "childrentickets", "multiples",
)
# Formatting leftovers: empty or one-letter `\text{}`s, ordinals, degrees, TeX spacing, quotes, chat tokens.
_TEX_LEFTOVERS = (
    "\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", "\\mathrm{th}",
    "^\\circ", "^{\\circ}", "\\;", ",\\!", "{,}", '"', "\\dots", "<|im_end|>", "<|endoftext|>",
)
_FIRST_INLINE_MATH = re.compile(r"\$(.*?)\$.*", re.DOTALL)
_UNWRAPPED = (re.compile(r"\\text\{(.*?)\}"), re.compile(r"\\textbf\{(.*?)\}"), re.compile(r"\\overline\{(.*?)\}"),
              re.compile(r"\\boxed\{(.*)\}"))


def normalize_final_answer(final_answer: str) -> str:
    r"""A final answer in the form DAPO compares: the part after the last "=", units and formatting
    dropped, the first `$...$` kept, `\text{}`/`\textbf{}`/`\overline{}`/`\boxed{}` unwrapped,
    `\fracab` -> `\frac{a}{b}`, `\sqrta` -> `\sqrt{a}`, and "1,000" -> "1000"."""
    answer = str(final_answer).rpartition("=")[2]
    for old, new in _REPLACEMENTS:
        answer = answer.replace(old, new)
    for gone in _UNIT_WORDS + _TEX_LEFTOVERS:
        answer = answer.replace(gone, "")
    head, dollar, rest = answer.partition("$")
    if dollar and "$" in rest:  # keep only the first inline-math span
        answer = "$" + _FIRST_INLINE_MATH.match(answer, len(head)).group(1) + "$"
    for pattern in _UNWRAPPED:
        answer = pattern.sub(r"\1", answer)
    answer = re.sub(r"frac([^{])(.)", r"frac{\1}{\2}", answer)
    answer = re.sub(r"sqrt([^{])", r"sqrt{\1}", answer)
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer.strip()


def _integer_form(answer: str) -> str:
    """DAPO's ground truths are integers: "42.0" compares as "42". A ground truth that is not an integer
    is compared in its normalised form (upstream raises for non-numbers and truncates "2.5" to "2")."""
    try:
        value = float(answer)
    except (ValueError, OverflowError):
        return answer
    if value.is_integer():
        return str(int(value))
    return answer


def is_correct_minerva(solution_str: str, gt: str, gt_need_extract: bool = False,
                       answer_pattern: str = r"(?i)Answer\s*:\s*([^\n]+)") -> tuple[bool, str]:
    """(whether the last "Answer: ..." of `solution_str` equals `gt`, the normalised prediction).

    `gt_need_extract`: the ground truth is a full solution whose last `\\boxed{}` holds the answer."""
    found = re.findall(answer_pattern, solution_str)
    pred = normalize_final_answer(found[-1] if found else INVALID_PRED)
    if gt_need_extract:
        boxed = last_boxed_only_string(gt)
        if boxed is None:
            raise ValueError(f"gt_need_extract=True but the ground truth has no \\boxed{{...}}: {gt[:200]!r}")
        gt = remove_boxed(boxed)
    return pred == _integer_form(normalize_final_answer(gt)), pred


def is_correct_strict_box(pred: str, gt: str, pause_tokens_index: list[int] | None = None) -> tuple[int, str | None]:
    r"""(1 when the last `\boxed{}` near the end of `pred` is exactly `gt`, else -1; the boxed content or None).

    "Near the end": the last 100 characters, or with `pause_tokens_index` (four token positions) from 100
    characters before the last pause onwards."""
    if pause_tokens_index is not None:
        if len(pause_tokens_index) != 4:
            raise ValueError(f"pause_tokens_index must hold 4 positions, got {len(pause_tokens_index)}")
        tail = pred[max(pause_tokens_index[-1] - 100, 0):]
    else:
        tail = pred[-100:]
    boxed = last_boxed_only_string(tail)
    extracted = remove_boxed(boxed) if boxed is not None else None
    return (1 if extracted == gt else -1), extracted


def verify(solution_str: str, answer: str, strict_box_verify: bool = False,
           pause_tokens_index: list[int] | None = None) -> tuple[bool, str | None]:
    """(correct, prediction) by the strict-box rule or the Minerva rule (see the module docstring)."""
    if strict_box_verify:
        score, pred = is_correct_strict_box(solution_str, answer, pause_tokens_index)
        return score == 1, pred
    return is_correct_minerva(solution_str, answer)


def compute_score(solution_str: str, ground_truth: str, strict_box_verify: bool = False,
                  pause_tokens_index: list[int] | None = None) -> dict[str, float | bool | str | None]:
    """{"score": 1.0 or -1.0, "acc": correct, "pred": the answer read} for the last 300 characters of
    `solution_str` against `ground_truth` (see the module docstring for the two rules)."""
    correct, pred = verify(solution_str[-300:], ground_truth, strict_box_verify, pause_tokens_index)
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}
