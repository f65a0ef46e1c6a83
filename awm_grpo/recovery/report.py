"""The recovery comparison's statistics, markdown table and plots (`awm_grpo.recovery.compare` writes them).

Two paired tests of an arm against a reference arm (B1), both two-sided:

- over seeds (the unit an RL comparison is usually replicated over): the same seed gives both arms
  the same start, prompts order and evaluation seed, so `d_s = m_arm(s) - m_ref(s)`,
  `t = mean(d) / (std(d) / sqrt(S))` with `S - 1` degrees of freedom (Student's t);
- over handovers: `d_h` = the arm's success rate on handover h minus the reference's, each averaged
  over seeds and samples; sign-flip permutation test on `mean(d_h)` (under H0 each `d_h` is
  symmetric about 0), `p = (1 + #{|mean(e * d)| >= |mean(d)|}) / (1 + K)` over K random sign
  vectors e (seeded, so the report is reproducible). It ignores the run-to-run spread the seed
  test measures; read both.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value, nan for none)."""
    if not values:
        return math.nan, math.nan
    m = sum(values) / len(values)
    s = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return m, s


def student_t_two_sided(t: float, df: int) -> float:
    """P(|T| >= |t|) for Student's t with `df` degrees of freedom (Simpson's rule on the density)."""
    if math.isnan(t):
        return math.nan
    t = abs(t)
    if math.isinf(t):
        return 0.0
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def density(x: float) -> float:
        return math.exp(log_c - (df + 1) / 2 * math.log1p(x * x / df))

    steps = 2000  # even; the density is smooth, so this is exact to ~1e-10 on [0, t]
    h = t / steps
    area = density(0) + density(t) + sum((4 if i % 2 else 2) * density(i * h) for i in range(1, steps))
    return max(0.0, min(1.0, 1.0 - 2.0 * area * h / 3.0))


def paired_t(arm: Sequence[float], ref: Sequence[float]) -> dict[str, float]:
    """Paired t-test over seeds: mean difference, t and two-sided p (nan with < 2 pairs or no spread)."""
    d = [a - b for a, b in zip(arm, ref, strict=True)]
    m, s = mean_std(d)
    if len(d) < 2:
        return {"diff": m, "t": math.nan, "p": math.nan, "n": len(d)}
    if s == 0:
        return {"diff": m, "t": math.nan if m == 0 else math.copysign(math.inf, m), "p": 1.0 if m == 0 else 0.0,
                "n": len(d)}
    t = m / (s / math.sqrt(len(d)))
    return {"diff": m, "t": t, "p": student_t_two_sided(t, len(d) - 1), "n": len(d)}


def sign_flip(diffs: Sequence[float], rounds: int = 10000, seed: int = 0) -> dict[str, float]:
    """Sign-flip permutation test of mean(diffs) = 0 (module docstring)."""
    n = len(diffs)
    if n == 0:
        return {"diff": math.nan, "p": math.nan, "n": 0}
    observed = abs(sum(diffs)) / n
    if observed == 0:
        return {"diff": 0.0, "p": 1.0, "n": n}
    rng = random.Random(seed)
    hits = sum(abs(sum(d if rng.random() < 0.5 else -d for d in diffs)) / n >= observed - 1e-12
               for _ in range(rounds))
    return {"diff": sum(diffs) / n, "p": (1 + hits) / (1 + rounds), "n": n}


def per_item_success(records: Sequence[dict[str, Any]]) -> dict[str, list[float]]:
    """Item key (scenario/task_idx) -> 1/0 outcome of each scored episode (infrastructure failures left out)."""
    out: dict[str, list[float]] = {}
    for r in records:
        if r.get("infra_error"):
            continue
        out.setdefault(f"{r['scenario']}/{r['task_idx']}", []).append(1.0 if r.get("verdict") == "complete" else 0.0)
    return out


def handover_diffs(arm_runs: Sequence[dict[str, list[float]]], ref_runs: Sequence[dict[str, list[float]]]) -> list[float]:
    """d_h over the handovers both arms played: per-handover success, pooled over seeds and samples."""
    def pooled(runs: Sequence[dict[str, list[float]]]) -> dict[str, float]:
        acc: dict[str, list[float]] = {}
        for run in runs:
            for key, vals in run.items():
                acc.setdefault(key, []).extend(vals)
        return {k: sum(v) / len(v) for k, v in acc.items() if v}

    a, b = pooled(arm_runs), pooled(ref_runs)
    return [a[k] - b[k] for k in sorted(set(a) & set(b))]


def learning_curve(records: Sequence[dict[str, Any]], handovers: bool) -> dict[int, float]:
    """Step -> success rate of the training episodes that started damaged (`handovers`) or not."""
    acc: dict[int, list[float]] = {}
    for r in records:
        if r.get("infra_error") or bool(r.get("handover")) != handovers:
            continue
        acc.setdefault(int(r["step"]), []).append(1.0 if r.get("verdict") == "complete" else 0.0)
    return {step: sum(v) / len(v) for step, v in sorted(acc.items())}


def smooth(curve: dict[int, float], window: int) -> dict[int, float]:
    """Trailing moving average over `window` steps (training batches are small, so single steps are noisy)."""
    steps = sorted(curve)
    return {s: sum(curve[x] for x in steps[max(0, i - window + 1): i + 1]) / len(steps[max(0, i - window + 1): i + 1])
            for i, s in enumerate(steps)}


def _test_cell(result: dict[str, float] | None, diff: bool) -> str:
    if not result or result.get("p") is None or math.isnan(result["p"]):
        return "-"
    return (f"{result['diff']:+.3f}, " if diff else "") + f"p={result['p']:.3f}"


def markdown_table(rows: dict[str, dict[str, tuple[float, float, int]]], columns: Sequence[str],
                   tests: dict[str, dict[str, dict[str, float] | None]] | None = None) -> str:
    """`| arm | col1 | ... |` with `mean +- std` cells; with `tests` (compare.paired_tests) three more columns:
    recovery_success against B1 over seeds (difference, p) and over handovers (p), SR_ordinary over seeds."""
    head = ["arm", *columns] + (["recovery vs B1, seeds", "recovery vs B1, handovers", "SR_ordinary vs B1, seeds"]
                                if tests else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, metrics in rows.items():
        cells = [arm] + [f"{metrics[c][0]:.3f} +- {metrics[c][1]:.3f}" if metrics.get(c) and metrics[c][2]
                         else "-" for c in columns]
        if tests:
            t = tests.get(arm) or {}
            cells += [_test_cell(t.get("recovery_seeds"), True), _test_cell(t.get("recovery_handovers"), False),
                      _test_cell(t.get("ordinary_seeds"), True)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(out: Path, curves: dict[str, dict[str, list[dict[int, float]]]],
         final: dict[str, dict[str, tuple[float, float, int]]], metrics: Sequence[str], title: str) -> list[Path]:
    """Two PNGs: learning curves (per kind: mean and min-max band over seeds per arm) and the held-out metrics."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    fig, axes = plt.subplots(1, len(curves), figsize=(6 * len(curves), 4), squeeze=False)
    for ax, (kind, by_arm) in zip(axes[0], curves.items(), strict=True):
        for arm, runs in by_arm.items():
            steps = sorted(set().union(*[set(c) for c in runs])) if runs else []
            if not steps:
                continue
            vals = [[c[s] for c in runs if s in c] for s in steps]
            ax.plot(steps, [sum(v) / len(v) for v in vals], label=arm)
            ax.fill_between(steps, [min(v) for v in vals], [max(v) for v in vals], alpha=0.15)
        ax.set_xlabel("training step")
        ax.set_ylabel("training success (moving mean)")
        ax.set_title({"recovery": "episodes from damaged states (handovers)",
                      "ordinary": "episodes from initial states"}.get(kind, kind), fontsize=9)
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    written.append(out / "learning_curves.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 4))
    arms = list(final)
    width = 0.8 / max(1, len(metrics))
    for j, metric in enumerate(metrics):
        means = [final[a][metric][0] if final[a].get(metric) and final[a][metric][2] else 0.0 for a in arms]
        stds = [final[a][metric][1] if final[a].get(metric) and final[a][metric][2] else 0.0 for a in arms]
        ax.bar([i + j * width for i in range(len(arms))], means, width, yerr=stds, capsize=3, label=metric)
    ax.set_xticks([i + width * (len(metrics) - 1) / 2 for i in range(len(arms))], arms, fontsize=8)
    ax.set_ylim(0, 1.02)
    ax.set_title(f"held-out, mean +- std over seeds: {title}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(out / "held_out.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    return written
