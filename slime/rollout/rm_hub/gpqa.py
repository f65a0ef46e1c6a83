"""Multiple-choice reward for GPQA-style questions (`--rm-type gpqa`): 1.0 for the right option, else 0.0.

The right option comes from `metadata["correct_letter"]`, else from the label: a letter ("C"), an index
(2 is "C"), or the text of one of `metadata["choices"]` (a list, or a dict whose values are the options).
The options are the letters `metadata["valid_letters"]`, else as many as there are choices, else A-J.

The response's choice is read after any `</think>`: "answer is C" / "option: C" / "choice C", "C is correct",
"final answer: C" (first phrase that names a valid letter), else its last standalone capital valid letter.
Without a letter on both sides, the response scores 1.0 when it contains the right option's text, the
metadata's `correct_answer` or `answer_text`, or the label text (all compared lower-case, alphanumerics only).
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable, Mapping
from typing import Any

DEFAULT_VALID_LETTERS = list(string.ascii_uppercase[:10])

# Phrases that announce a choice, tried in this order; case does not matter (so "answer is c" counts).
_CHOICE_PHRASES = tuple(re.compile(p, re.IGNORECASE) for p in (
    r"(?:answer|option|choice)\s*(?:is|:)?\s*([A-Z])",
    r"([A-Z])\s*is\s*(?:the)?\s*correct",
    r"final\s*(?:answer|option)\s*(?:is|:)?\s*([A-Z])",
))
_LONE_CAPITAL = re.compile(r"\b([A-Z])\b")


def _after_thinking(text: str | None) -> str:
    return (text or "").rpartition("</think>")[2]


def _comparable(text: str) -> str:
    """Lower case, every run of non-alphanumerics one space: how option texts are compared."""
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).strip()


def _chosen_letter(response: str, valid_letters: Iterable[str]) -> str | None:
    """The option letter `response` picks (see the module docstring), or None."""
    text = _after_thinking(response)
    if not text:
        return None
    valid = {str(letter).upper() for letter in valid_letters}
    for phrase in _CHOICE_PHRASES:
        found = phrase.search(text)
        if found and found.group(1).upper() in valid:
            return found.group(1).upper()
    return next((c for c in reversed(_LONE_CAPITAL.findall(text)) if c in valid), None)


def _choices(metadata: Mapping[str, Any]) -> list[Any] | None:
    choices = metadata.get("choices")
    if isinstance(choices, Mapping):
        return list(choices.values())
    return None if choices is None else list(choices)


def compute_gpqa_reward(response: str | None, label: Any, metadata: Mapping[str, Any] | None = None) -> float:
    """1.0 when `response` picks the right option of a multiple-choice question, else 0.0."""
    if response is None:
        return 0.0
    metadata = metadata or {}
    choices = _choices(metadata)
    if metadata.get("valid_letters"):
        letters = [str(letter).upper() for letter in metadata["valid_letters"]]
    elif choices:
        letters = list(string.ascii_uppercase[:len(choices)])
    else:
        letters = DEFAULT_VALID_LETTERS
    given_letter = metadata.get("correct_letter")
    correct = given_letter.strip().upper() if isinstance(given_letter, str) else None

    label_text = label.strip() if isinstance(label, str) else None
    if label_text is not None and not correct and len(label_text) == 1 and label_text.upper() in letters:
        correct = label_text.upper()
    elif isinstance(label, int | float) and 0 <= int(label) < len(letters):
        correct = letters[int(label)]
    if not correct and choices and label_text:
        for letter, choice in zip(letters, choices, strict=False):
            if _comparable(str(choice)) == _comparable(label_text):
                correct = letter
                break

    picked = _chosen_letter(response, letters)
    if picked and correct:
        return float(picked == correct)

    targets: list[str] = []
    if correct and choices and correct in letters and letters.index(correct) < len(choices):
        targets.append(str(choices[letters.index(correct)]))
    for key in ("correct_answer", "answer_text"):
        if metadata.get(key):
            targets.append(str(metadata[key]))
    if label_text:
        targets.append(label_text)
    said = _comparable(_after_thinking(response))
    if any(target and target in said for target in {_comparable(t) for t in targets}):
        return 1.0
    if picked and not correct and label_text:
        return float(picked == label_text.upper())
    return 0.0
