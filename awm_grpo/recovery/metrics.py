"""Recovery metrics (docs/recovery-method.md, Metrics), from a small explicit per-episode record.

The rollout maps its traces onto `EpisodeRecord` / `TurnRecord`; `recovery_metrics` returns every
metric for all episodes and per task type. Definitions (P = proposed where the plan gives none):

    SR    complete / scored episodes (infrastructure failures excluded, counted apart)
    RR    success share among episodes with >= 1 explicit tool error or >= 1 negative-progress step
    DRR   (P) Phi drops at some turn, later exceeds its pre-dip level, and the task completes;
          over all episodes and over episodes with a dip
    DSR   write turns with R_prog = phi_after - phi_before < 0, over write turns
    duplicate_effects     (P) turns that re-insert a row content already inserted in the episode
                          (same table + content fingerprint), or repeat an earlier state-changing
                          call (same tool and arguments) and change the DB again
    contradictory_updates (P) (table, row key) written (inserted/updated) at one turn and updated or
                          deleted again at a later turn
    irreversible_damage   (P) episodes ending with any preservation predicate unmet
    premature_stop        (P) final answer while Phi < 1, verdict not complete, turns left
    verification_first    (P) share of handovers (controlled split) or, without one, of first
                          errors/dips, whose next action is a task-relevant read
    progress patterns     monotonic_success, dip_and_recover_success, dip_and_fail,
                          continual_damage (>= 2 dips, no rise after the first), flat_fail, rise_fail
    post-error next action  blind_retry (same call), argument_revision (same tool), verification
                          (a read), tool_switch (another write tool), stop (final answer or end)
    progress credit       (P) how many state-mutating tasks of a batch have predicates and how many of
                          them got R_prog != 0 somewhere (`progress_credit`): whether the method's
                          progress term reaches the tasks at all
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

NEXT_ACTIONS = ("blind_retry", "argument_revision", "verification", "tool_switch", "stop")
PATTERNS = ("monotonic_success", "dip_and_recover_success", "dip_and_fail", "continual_damage", "flat_fail",
            "rise_fail")


@dataclass
class TableChange:
    """Rows one turn changed in one table: primary keys (as strings) and optional content fingerprints."""

    inserted: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    inserted_fingerprints: list[str] = field(default_factory=list)  # hash of each inserted row minus its key


@dataclass
class TurnRecord:
    """One turn: at most one tool call, or the final answer."""

    tool: str | None = None
    arguments: dict[str, Any] | None = None
    label: str = "read"  # "read" or a write label (create/update/delete/mixed/write)
    error: bool = False  # explicit tool error
    phi_before: float | None = None
    phi_after: float | None = None
    changes: dict[str, TableChange] = field(default_factory=dict)
    is_final_answer: bool = False
    relevant_read: bool = False  # a read of a table the task's predicates use

    @property
    def is_write(self) -> bool:
        return self.tool is not None and self.label != "read"

    @property
    def progress(self) -> float:
        """R_prog of the turn (0 for reads and where Phi is unknown)."""
        if not self.is_write or self.phi_before is None or self.phi_after is None:
            return 0.0
        return self.phi_after - self.phi_before

    @property
    def changed_db(self) -> bool:
        return any(c.inserted or c.updated or c.deleted for c in self.changes.values())


@dataclass
class EpisodeRecord:
    """One scored rollout."""

    task_type: str  # info_seeking | state_mutating | ambiguous
    verdict: str  # complete | others | ...
    turns: list[TurnRecord]
    infra_failure: bool = False
    max_turns: int = 15
    preservation_end: list[float] = field(default_factory=list)  # phi of each preservation predicate at the end
    handover_turn: int | None = None  # controlled recovery split: index of the tested policy's first turn
    task: str | None = None  # "scenario#task_idx": episodes of one task share it (progress_credit)
    predicates: int | None = None  # the task's progress predicates (None: the run tracked no progress)

    @property
    def success(self) -> bool:
        return self.verdict == "complete"


def _dips(ep: EpisodeRecord) -> list[int]:
    return [i for i, t in enumerate(ep.turns) if t.progress < 0]


def _recovered(ep: EpisodeRecord) -> bool:
    """Phi, after its first drop, later exceeds the level it had before that drop."""
    dips = _dips(ep)
    if not dips:
        return False
    level = ep.turns[dips[0]].phi_before
    return any(t.phi_after is not None and t.phi_after > level for t in ep.turns[dips[0] + 1:])


def progress_pattern(ep: EpisodeRecord) -> str:
    dips = _dips(ep)
    if ep.success:
        return "dip_and_recover_success" if dips else "monotonic_success"
    if len(dips) >= 2 and not any(t.progress > 0 for t in ep.turns[dips[0] + 1:]):
        return "continual_damage"
    if dips:
        return "dip_and_fail"
    return "rise_fail" if any(t.progress > 0 for t in ep.turns) else "flat_fail"


def next_action(turn: TurnRecord, nxt: TurnRecord | None) -> str:
    """What the agent did right after `turn` (see NEXT_ACTIONS)."""
    if nxt is None or nxt.tool is None or nxt.is_final_answer:
        return "stop"
    if nxt.tool == turn.tool:
        same = json.dumps(nxt.arguments, sort_keys=True) == json.dumps(turn.arguments, sort_keys=True)
        return "blind_retry" if same else "argument_revision"
    return "verification" if not nxt.is_write else "tool_switch"


def duplicate_effects(ep: EpisodeRecord) -> int:
    seen_rows: set[tuple[str, str]] = set()
    seen_calls: set[str] = set()
    count = 0
    for t in ep.turns:
        dup = False
        for table, ch in t.changes.items():
            for fp in ch.inserted_fingerprints:
                dup |= (table, fp) in seen_rows
                seen_rows.add((table, fp))
        if t.is_write and t.changed_db and not t.error:
            call = f"{t.tool}|{json.dumps(t.arguments, sort_keys=True)}"
            dup |= call in seen_calls
            seen_calls.add(call)
        count += dup
    return count


def contradictory_updates(ep: EpisodeRecord) -> int:
    written: set[tuple[str, str]] = set()
    count = 0
    for t in ep.turns:
        later = {(tb, k) for tb, ch in t.changes.items() for k in ch.updated + ch.deleted}
        count += len(later & written)
        written |= {(tb, k) for tb, ch in t.changes.items() for k in ch.inserted + ch.updated}
    return count


def _rate(num: int, den: int) -> dict[str, Any]:
    return {"rate": round(num / den, 4) if den else None, "n": num, "of": den}


def _first_trouble(ep: EpisodeRecord) -> int | None:
    return next((i for i, t in enumerate(ep.turns) if t.error or t.progress < 0), None)


def _summary(eps: list[EpisodeRecord], infra: int) -> dict[str, Any]:
    troubled = [e for e in eps if _first_trouble(e) is not None]
    dipped = [e for e in eps if _dips(e)]
    drr = [e for e in dipped if _recovered(e) and e.success]
    writes = [t for e in eps for t in e.turns if t.is_write]
    premature = [e for e in eps if e.turns and e.turns[-1].is_final_answer and not e.success
                 and (e.turns[-1].phi_after if e.turns[-1].phi_after is not None else 0.0) < 1.0
                 and len(e.turns) < e.max_turns]
    with_pres = [e for e in eps if e.preservation_end]
    next_actions: Counter[str] = Counter()
    for e in eps:
        for i, t in enumerate(e.turns):
            if t.error or t.progress < 0:
                next_actions[next_action(t, e.turns[i + 1] if i + 1 < len(e.turns) else None)] += 1
    vf_num = vf_den = 0
    for e in eps:
        start = e.handover_turn if e.handover_turn is not None else _first_trouble(e)
        if start is None:
            continue
        first = start if e.handover_turn is not None else start + 1
        vf_den += 1
        if first < len(e.turns) and e.turns[first].tool is not None and not e.turns[first].is_write \
                and e.turns[first].relevant_read:
            vf_num += 1
    out = {
        "episodes": len(eps), "infra_failures": infra,
        "SR": _rate(sum(e.success for e in eps), len(eps)),
        "RR": _rate(sum(e.success for e in troubled), len(troubled)),
        "DRR_all": _rate(len(drr), len(eps)), "DRR_dipped": _rate(len(drr), len(dipped)),
        "DSR": _rate(sum(t.progress < 0 for t in writes), len(writes)),
        "duplicate_effect_count": sum(duplicate_effects(e) for e in eps),
        "contradictory_update_count": sum(contradictory_updates(e) for e in eps),
        "irreversible_damage_rate": _rate(sum(any(v < 1.0 for v in e.preservation_end) for e in with_pres),
                                          len(with_pres)),
        "premature_stop_rate": _rate(len(premature), len(eps)),
        "verification_first_rate": _rate(vf_num, vf_den),
        "progress_patterns": {p: sum(progress_pattern(e) == p for e in eps) for p in PATTERNS},
        "post_error_next_action": {a: next_actions[a] for a in NEXT_ACTIONS},
    }
    handed = [e for e in eps if e.handover_turn is not None]
    if handed:
        out["recovery_success"] = _rate(sum(e.success for e in handed), len(handed))
        out["additional_damage"] = _rate(sum(any(t.progress < 0 for t in e.turns[e.handover_turn:]) for e in handed),
                                         len(handed))
    return out


def recovery_metrics(episodes: list[EpisodeRecord]) -> dict[str, dict[str, Any]]:
    """Every metric over all scored episodes and per task type ({"all": ..., "state_mutating": ...})."""
    scored = [e for e in episodes if not e.infra_failure]
    out = {"all": _summary(scored, len(episodes) - len(scored))}
    for tt in sorted({e.task_type for e in episodes}):
        group = [e for e in scored if e.task_type == tt]
        out[tt] = _summary(group, sum(e.infra_failure for e in episodes if e.task_type == tt))
    return out


def makes_progress(turn: TurnRecord) -> bool:
    """R_prog != 0 in the difference form: a write-labelled turn after which Phi differs from Phi before it."""
    return abs(turn.progress) > 1e-12


def progress_credit(episodes: list[EpisodeRecord]) -> dict[str, float]:
    """Does the progress term reach the tasks? Counts over one batch (a training step), {} without progress tracking.

    Over scored episodes (infrastructure failures and episodes without a `task` key left out) whose run tracked
    progress (`predicates` not None), with tasks told apart by `task` and state-mutating meaning `task_type`:

        progress_sm_tasks            distinct state-mutating tasks
        progress_tasks               of them, tasks with >= 1 progress predicate
        progress_write_tasks         of those, tasks where some episode changed the DB in a write-labelled turn
                                     (rows of tables with a primary key, as the rollout records them): the
                                     policy's side of the count
        progress_credit_tasks        of those, tasks where some turn of some episode has R_prog != 0: a write-
                                     labelled turn after which Phi (all predicates, scalar ones as valued; the
                                     difference form, whatever awm_credit_progress_form says) differs from Phi
                                     before it, up or down
        progress_credit_task_rate    progress_credit_tasks / progress_tasks
        progress_credit_sm_task_rate progress_credit_tasks / progress_sm_tasks (the issue's "most state-mutating
                                     tasks": tasks without predicates count as uncredited)
        progress_credit_episode_rate episodes of progress_tasks with >= 1 such turn / episodes of progress_tasks

    Rates are left out when their denominator is 0. Credit needs both predicates and a policy that writes:
    progress_credit_tasks well below progress_write_tasks says the predicates miss what the writes change (or
    the writes are wrong); progress_write_tasks well below progress_tasks says the policy does not write.
    """
    eps = [e for e in episodes if not e.infra_failure and e.task is not None and e.predicates is not None]
    if not eps:
        return {}
    sm = [e for e in eps if e.task_type == "state_mutating"]
    with_preds = [e for e in sm if e.predicates]
    credited = [e for e in with_preds if any(makes_progress(t) for t in e.turns)]
    wrote = [e for e in with_preds if any(t.is_write and t.changed_db for t in e.turns)]
    sm_tasks, tasks, write_tasks, credit_tasks = ({e.task for e in group} for group in (sm, with_preds, wrote,
                                                                                         credited))
    out = {"progress_sm_tasks": float(len(sm_tasks)), "progress_tasks": float(len(tasks)),
           "progress_write_tasks": float(len(write_tasks)), "progress_credit_tasks": float(len(credit_tasks))}
    for key, num, den in (("progress_credit_task_rate", len(credit_tasks), len(tasks)),
                          ("progress_credit_sm_task_rate", len(credit_tasks), len(sm_tasks)),
                          ("progress_credit_episode_rate", len(credited), len(with_preds))):
        if den:
            out[key] = round(num / den, 4)
    return out


def flat_metrics(metrics: dict[str, dict[str, Any]]) -> dict[str, float]:
    """`{"state_mutating/SR": 0.4, ...}`: one number per metric for a logger (rates and counts only)."""
    flat: dict[str, float] = {}
    for split, m in metrics.items():
        for key, value in m.items():
            if isinstance(value, dict) and "rate" in value:
                if value["rate"] is not None:
                    flat[f"{split}/{key}"] = value["rate"]
            elif isinstance(value, dict):
                flat.update({f"{split}/{key}/{k}": float(v) for k, v in value.items()})
            else:
                flat[f"{split}/{key}"] = float(value)
    return flat
