"""Token-overlap F1 of a short answer (`--rm-type f1`, the reward is the F1 alone), SQuAD/HotpotQA style.

Both texts are lower-cased, stripped of punctuation and of the articles a/an/the, and split on
whitespace. A yes/no/noanswer on either side must match the other side exactly, else the score is 0.
"""

from __future__ import annotations

import re
import string
from collections import Counter

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(?:a|an|the)\b")
_CLOSED_ANSWERS = frozenset({"yes", "no", "noanswer"})


def normalize_answer(s: str) -> str:
    """`s` lower-cased, without punctuation or articles, single-spaced: the form F1 compares."""
    no_punct = "".join(ch for ch in s.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", no_punct).split())


def f1_score(prediction: str | None, ground_truth: str) -> tuple[float, float, float]:
    """(f1, precision, recall) of `prediction`'s tokens against `ground_truth`'s; (0, 0, 0) for no
    prediction, no shared token, or a yes/no/noanswer that the other side does not repeat."""
    zero = (0, 0, 0)
    if prediction is None:
        return zero
    pred, truth = normalize_answer(prediction), normalize_answer(ground_truth)
    if (pred in _CLOSED_ANSWERS or truth in _CLOSED_ANSWERS) and pred != truth:
        return zero
    pred_tokens, truth_tokens = pred.split(), truth.split()
    shared = sum((Counter(pred_tokens) & Counter(truth_tokens)).values())
    if shared == 0:
        return zero
    precision, recall = shared / len(pred_tokens), shared / len(truth_tokens)
    return 2 * precision * recall / (precision + recall), precision, recall
