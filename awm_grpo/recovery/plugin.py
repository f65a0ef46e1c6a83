"""Recovery method in training: per-turn rewards and credit as slime's custom advantage function, and metrics.

    --custom-advantage-function-path awm_grpo.recovery.advantages

Per sample the rollout (with `awm_predicates`, see awm_grpo.recovery.progress) leaves compact per-turn
signals in `sample.metadata["awm"]["credit"]`: each model turn's response-token span [start, end),
Phi after it, write / error / format / relevant-read flags. Per group of rollouts (same
`group_index`) this module builds `awm_grpo.recovery.credit.EpisodeSignals` and applies credit.py:

    r(t)    = lambda R_prog(t) + gamma_v R_verify(t) + R_fmt(t) + 1[t = T] R_out      (ours, traj_agg)
    G_{i,t} = sum_{u >= t} eta^(u-t) r_i(u);  A_{i,t} = carry + leave-one-out advantage (credit.py)

and puts A_{i,t} on the model tokens of turn t (observation tokens keep loss mask 0, so they get 0;
the loss mask stays a 0/1 mask). R_out is reward.py's outcome (one place turns a verdict into a
reward); R_fmt = -1 on the first turn with an invalid call (reward.py charges the penalty once per
episode, so B1 here equals plain GRPO on reward.py's reward even when invalid calls do not terminate).

Switches (keys of the runtime YAML, i.e. attributes of args; unset ones take `credit.CreditConfig`'s defaults):

| key | meaning |
|---|---|
| awm_credit_method | b1: outcome-only trajectory GRPO (= plain GRPO); b2: action-based step reward with turn-level credit; b2plus: an LLM judge's per-call score as the step reward (awm_grpo.recovery.judge); ours; traj_agg: ours' rewards summed per trajectory |
| awm_credit_lambda | progress weight lambda |
| awm_credit_beta | verification bonus beta (0 = no bonus, ablation V1) |
| awm_credit_gamma_v | weight of the verification bonus |
| awm_credit_eta | turn discount eta |
| awm_credit_progress_form | difference (write-gated) or potential (eta Phi_t - Phi_{t-1}) |
| awm_credit_estimator | carry (+ leave-one-out) or naive (per-index pools, biased; for comparison) |
| awm_credit_baseline / _scale | carry estimator's baseline (loo, mean) and scale (none, group_std) |
| awm_credit_binary_only | scalar predicates count only when met exactly (ablation S1) |
| awm_judge_url / _model / ... | B2+'s judge (awm_grpo.recovery.judge): the rollout records a score per tool turn in metadata["awm"]["judge"] |

With B1's sliding window (`awm_history_window_turns`, awm_grpo.rollout) an episode arrives as its own
sample plus one sample per windowed turn (`metadata["awm_segment"]`): b1's statistics are over
episodes, and each turn sample gets its episode's advantage.

b1 and traj_agg return one number per sample (slime spreads it over the response); the others one
value per response token. Infrastructure failures (FAILED, ABORTED, `remove_sample`) get 0 and stay
out of every group statistic. Trajectory methods follow `--disable-grpo-std-normalization` (and, as
slime's GRPO, skip the std when `--n-samples-per-prompt` is 1).
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from awm_grpo.recovery.credit import (
    CreditConfig,
    EpisodeSignals,
    TurnValues,
    episode_rewards,
    group_turn_advantages,
    trajectory_advantages,
)
from awm_grpo.recovery.metrics import (
    EpisodeRecord,
    TableChange,
    TurnRecord,
    flat_metrics,
    progress_credit,
    recovery_metrics,
)
from awm_grpo.reward import outcome
from slime.algorithms.advantages import spread_turn_values
from slime.utils.types import Sample

METHODS = ("b1", "b2", "b2plus", "ours", "traj_agg")


def credit_config(args: argparse.Namespace) -> tuple[CreditConfig, bool]:
    """(CreditConfig, binary_only) from the awm_credit_* attributes of args."""
    def get(name: str, default: Any) -> Any:
        value = getattr(args, f"awm_credit_{name}", None)
        return default if value is None else value

    d = CreditConfig()
    method = get("method", d.method)
    if method not in METHODS:
        raise ValueError(f"awm_credit_method {method!r} is unknown: use one of {', '.join(METHODS)}")
    cfg = CreditConfig(method=method, lam=float(get("lambda", d.lam)), beta=float(get("beta", d.beta)),
                       gamma_v=float(get("gamma_v", d.gamma_v)), eta=float(get("eta", d.eta)),
                       progress_form=get("progress_form", d.progress_form), estimator=get("estimator", d.estimator),
                       baseline=get("baseline", d.baseline), scale=get("scale", d.scale),
                       binary_only=bool(get("binary_only", d.binary_only)),
                       max_turns=int(getattr(args, "awm_max_turns", None) or d.max_turns))
    for name, value, allowed in (("progress_form", cfg.progress_form, ("difference", "potential")),
                                 ("estimator", cfg.estimator, ("carry", "naive")),
                                 ("baseline", cfg.baseline, ("loo", "mean")), ("scale", cfg.scale, ("none", "group_std"))):
        if value not in allowed:
            raise ValueError(f"awm_credit_{name} {value!r} is unknown: use one of {', '.join(allowed)}")
    return cfg, cfg.binary_only


def _valid(sample: Sample) -> bool:
    awm = (sample.metadata or {}).get("awm") or {}
    return (sample.status not in (Sample.Status.ABORTED, Sample.Status.FAILED) and not sample.remove_sample
            and not awm.get("infra_error") and awm.get("turns", 0) > 0)


def signals(args: argparse.Namespace, sample: Sample, cfg: CreditConfig, binary_only: bool = False) -> EpisodeSignals:
    """EpisodeSignals of one rollout from its `metadata["awm"]` (b1 needs no progress signals)."""
    awm = (sample.metadata or {}).get("awm")
    if awm is None:
        raise ValueError("sample has no metadata['awm']: use awm_grpo.rollout.generate as the generate function")
    penalty = getattr(args, "awm_invalid_call_penalty", None)
    if penalty is not None and float(penalty) != -1.0:
        raise ValueError(f"awm_invalid_call_penalty {penalty}: the credit path uses R_fmt = -1 (credit.turn_rewards); "
                         "set it to -1.0 with awm_grpo.recovery.advantages")
    credit = awm.get("credit")
    r_out = outcome(args, awm)
    if credit is None:
        if cfg.method != "b1":
            raise ValueError(f"awm_credit_method {cfg.method!r} needs per-turn progress: set awm_predicates to a "
                             "predicates JSONL (`python -m awm.predicates build --out PATH`)")
        T = int(awm["turns"])
        fmt = [False] * (T - 1) + [bool(awm.get("invalid_calls"))]
        return EpisodeSignals([0.0] * (T + 1), [False] * T, [False] * T, [False] * T, fmt, r_out)
    phis = credit["phi_b"] if binary_only else credit["phi"]
    phi0 = credit["phi0_b"] if binary_only else credit["phi0"]
    first = next((t for t, bad in enumerate(credit["fmt"]) if bad), None)  # reward.py charges the penalty once
    fmt = [t == first for t in range(len(credit["fmt"]))]
    judge = awm.get("judge")
    return EpisodeSignals([float(phi0), *map(float, phis)], list(credit["write"]), list(credit["error"]),
                          list(credit["rel_read"]), fmt, r_out, list(credit["ok"]), list(credit["rel_tool"]),
                          None if judge is None else list(judge))


def pad_turns(values: TurnValues, num_turns: int | None = None) -> Tensor:
    """[B, K] float tensor of per-turn values, zero-padded past each rollout's last turn."""
    K = num_turns or max((len(v) for v in values), default=1) or 1
    out = torch.zeros(len(values), K)
    for i, v in enumerate(values):
        if v:
            out[i, : len(v)] = torch.tensor(v[:K], dtype=out.dtype)
    return out


def to_token_advantages(values: TurnValues, turn_ids: Tensor, loss_mask: Tensor) -> Tensor:
    """Per-token advantages [B, T]: turn t's advantage on the model tokens of turn t (turn id t-1)."""
    return spread_turn_values(pad_turns(values), turn_ids, loss_mask)


def _spread(sample: Sample, values: list[float]) -> list[float]:
    """Turn t's advantage on the loss-mask tokens of its span; everything else 0."""
    spans = sample.metadata["awm"]["credit"]["span"]
    if len(spans) != len(values):
        raise ValueError(f"sample {sample.index}: {len(values)} turn advantages for {len(spans)} turn spans")
    turn_ids = torch.full((1, sample.response_length), -1, dtype=torch.long)
    for t, (start, end) in enumerate(spans):
        if not 0 <= start <= end <= sample.response_length:
            raise ValueError(f"sample {sample.index}: turn {t + 1} span [{start}, {end}) is outside its "
                             f"{sample.response_length} response tokens")
        turn_ids[0, start:end] = t
    mask = torch.tensor([sample.loss_mask or [1] * sample.response_length], dtype=torch.float32)
    return to_token_advantages([values], turn_ids, mask)[0].tolist()


def advantages(args: argparse.Namespace, samples: Sequence[Sample]) -> list[float | list[float]]:
    """slime custom advantage function (module docstring): per-sample or per-token advantages."""
    cfg, binary_only = credit_config(args)
    trajectory = cfg.method in ("b1", "traj_agg")
    out: list[float | list[float]] = [0.0] * len(samples)
    groups: dict[Any, list[int]] = defaultdict(list)
    segment_of: dict[int, Any] = {}  # B1's sliding window: turns trained in samples of their own
    for i, s in enumerate(samples):
        segment = (s.metadata or {}).get("awm_segment")
        if segment is not None:
            segment_of[i] = segment["of"]
        elif _valid(s):
            groups[s.group_index if s.group_index is not None else ("alone", i)].append(i)
    if segment_of and not trajectory:
        raise ValueError(f"awm_credit_method {cfg.method!r} cannot credit a windowed episode's turn samples: "
                         "awm_history_window_turns is for b1 only")
    for members in groups.values():
        sigs = [signals(args, samples[i], cfg, binary_only) for i in members]
        if trajectory:
            totals = [sum(episode_rewards(sig, cfg)) for sig in sigs]
            std = not getattr(args, "disable_grpo_std_normalization", False) \
                and getattr(args, "n_samples_per_prompt", 2) > 1  # as slime's GRPO
            adv = trajectory_advantages(totals, [1] * len(totals), std_normalize=std, eps=cfg.eps)
            for i, a in zip(members, adv, strict=True):
                out[i] = a[0]
        else:
            for i, a in zip(members, group_turn_advantages(sigs, cfg), strict=True):
                out[i] = _spread(samples[i], a)
    episode_at = {s.index: i for i, s in enumerate(samples) if i not in segment_of}
    for i, of in segment_of.items():  # a windowed turn: its episode's advantage (0 if the episode is out)
        j = episode_at.get(of)
        out[i] = out[j] if j is not None and _valid(samples[i]) else 0.0
    for i, s in enumerate(samples):  # per-token methods: excluded samples still need one value per token
        if not trajectory and not isinstance(out[i], list):
            out[i] = [0.0] * s.response_length
    return out


# ---- traces -> recovery metrics --------------------------------------------------------------------
def episode_record(record: dict[str, Any], max_turns: int = 15) -> EpisodeRecord:
    """The EpisodeRecord of one trace record (awm_grpo.traces); progress fields need awm_predicates."""
    rec = record.get("recovery") or {}
    credit = rec.get("credit") or {}
    turns_in = record.get("turns") or []
    turns: list[TurnRecord] = []
    phi = rec.get("phi0")
    for i, t in enumerate(turns_in):
        calls = [c for c in t.get("calls") or [] if "name" in c]
        first = calls[0] if calls else None
        after = credit["phi"][i] if credit.get("phi") and i < len(credit["phi"]) else None
        rows = (t.get("progress") or {}).get("rows") or {}
        changes = {tb: TableChange(ch["inserted"], ch["updated"], ch["deleted"], ch.get("fingerprints", []))
                   for tb, ch in rows.items()}
        write = credit["write"][i] if credit.get("write") and i < len(credit["write"]) else False
        turns.append(TurnRecord(
            tool=first["name"] if first else None, arguments=first.get("arguments") if first else None,
            label="write" if write else "read", error=any(c.get("is_error") for c in calls),
            phi_before=phi, phi_after=after, changes=changes,
            is_final_answer=not t.get("calls") and i == len(turns_in) - 1 and record.get("final_answer") is not None,
            relevant_read=bool(credit.get("rel_read") and i < len(credit["rel_read"]) and credit["rel_read"][i])))
        phi = after if after is not None else phi
    return EpisodeRecord(
        task_type=record.get("task_type") or rec.get("task_type") or "unlabelled", verdict=str(record.get("verdict")),
        turns=turns, infra_failure=bool(record.get("infra_error")), max_turns=max_turns,
        preservation_end=list(rec.get("preservation_end") or []),
        handover_turn=0 if rec.get("prefix_turns") else None,
        task=f"{record['scenario']}#{record['task_idx']}" if "scenario" in record and "task_idx" in record else None,
        predicates=int(rec["predicates"]) if rec.get("predicates") is not None else None)


def trace_metrics(records: Sequence[dict[str, Any]], prefix: str, max_turns: int = 15) -> dict[str, float]:
    """Flat recovery metrics of trace records: `<prefix>/<split>/<metric>` (all and per task type) and, with
    awm_predicates, `<prefix>/progress_credit_tasks` and the other counts of metrics.progress_credit."""
    if not records:
        return {}
    episodes = [episode_record(r, max_turns) for r in records]
    flat = {**flat_metrics(recovery_metrics(episodes)), **progress_credit(episodes)}
    return {f"{prefix}/{k}": v for k, v in flat.items()}
