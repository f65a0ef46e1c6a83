"""Final states the verifier accepts, found from the verifier itself where no reference solution exists.

AWM-1K ships a verifier for every task and a solution for none. Progress predicates need a state
that completes the task (their targets) and states that do not (to check them against). This module
builds both by searching, from the initial state s0, for database edits the verifier's own
observations point to:

1. The verifier runs in the sandbox rewritten to report what it does (`verifier_analysis.traced_run`
   with `observe`): every statement it executes, every comparison with its operand values, every
   truth test and keyed lookup, in order.
2. Where it rejects, the last observations before it returned say what is missing, and each becomes
   an edit: a count (`len(rows) != 1` after a final-DB query: insert a row that query selects, with
   the values its conditions demand and its join partners' keys, or delete one); a value
   (`row["status"] != "active"` where "its left operand is a cell of a final-DB row": update that
   cell); a membership (`pid not in ids` where ids are a final column: insert a row holding pid);
   a missing key (`after[copy_id]`); an answer (`name in answer` with an empty answer: mention it).
3. An edit is kept when the verifier then gets further (evaluates more distinct comparison sites)
   or accepts. Once accepted, edits it does not need are removed one at a time, and a second
   accepting state is built from the same edits with other donor rows for every column no
   observation set, so values the verifier never constrains cannot become predicate targets.

`GoalSearch.checked` lists every state the search can vouch for with the plain verifier's verdict
(s0, each prefix of the edits, each state missing one edit, both accepting states): the builder
keeps a predicate set only when Phi = 1 on exactly the accepted ones.

Trust: the verifier and everything it reports are untrusted. It runs only in the sandbox; its log
is read as bounded data; the edits are parameterised statements this module writes on scratch
copies of s0; conditions taken from its SQL text are only ever run read-only.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from awm.predicates.edits import Edit, States, answer_of, extend
from awm.predicates.proposals import Proposer
from awm.predicates.verifier_analysis import traced_run
from awm.verifier import VerifierSandbox

MAX_RUNS = 300  # observed verifier runs per task (a few ms each)
MAX_EDITS = 24
MAX_SECONDS = 60.0  # wall time of one task's search


@dataclass
class Outcome:
    """One observed verifier run on a candidate state."""

    verdict: str  # complete | others | error
    events: list[Any]
    sites: int  # distinct comparison / truth / lookup sites evaluated: how far it got
    detail: str = ""


@dataclass
class GoalSearch:
    """The result of `search` for one task."""

    accepting: list[Path] = field(default_factory=list)  # [A, B]: both accepted by the verifier
    answer: str | None = None
    edits: list[Edit] = field(default_factory=list)
    checked: list[tuple[Path, str]] = field(default_factory=list)  # (state, plain verdict with `answer`)
    runs: int = 0
    reason: str = ""  # why no accepting state was found ("" when one was)
    second_from_other_donors: bool = False  # B differs from A in every column the verifier leaves free
    free_columns: int = 0  # columns of A's edits found free (B changes them and the verifier still accepts)
    partial: list[Edit] = field(default_factory=list)  # no accepting state: the edits that got it furthest

class _Search:
    """One task's search: its scratch states, its proposer, and the verifier runs it spends."""

    def __init__(self, sandbox: VerifierSandbox, code: str, s0: Path, workdir: Path, max_runs: int,
                 task: str = "") -> None:
        self.sandbox, self.code, self.s0, self.max_runs = sandbox, code, s0, max_runs
        self.states = States(s0, workdir)
        self.schema = self.states.schema
        self.proposer = Proposer(self.schema, s0, code, task)
        self.runs = 0

    def observe(self, edits: list[Edit]) -> tuple[Outcome, Path | None]:
        state = self.states.materialize(edits)
        if state is None:
            return Outcome("error", [], -1, "an edit does not apply"), None
        self.runs += 1
        trace = traced_run(self.sandbox, self.code, str(self.s0), str(state), final_answer=answer_of(edits),
                           observe=True, timeout_s=10.0)
        verdict = "error"
        if trace.status == "ok" and isinstance(trace.value, dict):
            verdict = "complete" if trace.value.get("result") == "complete" else "others"
        sites = {(e[0], e[1]) for e in trace.events if isinstance(e, list) and len(e) > 1}
        return Outcome(verdict, trace.events, len(sites), trace.error), state


def _last_check(out: Outcome) -> str:
    last = next((e for e in reversed(out.events) if isinstance(e, list) and e and e[0] in ("cmp", "truth")), None)
    return json.dumps(last, default=repr)


def _better(out: Outcome, best: Outcome) -> bool:
    """The verifier accepts, reaches more distinct sites, or fails later in a loop at another check.

    The last rule lets a loop over rows advance (the failing comparison moves to the next row); a row
    inserted into an earlier loop lengthens the run but leaves the failing check as it was.
    """
    if out.verdict == "complete" or out.sites > best.sites:
        return True
    return (out.sites == best.sites and len(out.events) > len(best.events) and out.verdict != "error"
            and _last_check(out) != _last_check(best))

def search(sandbox: VerifierSandbox, code: str, s0: Path, workdir: Path, *, task: str = "",
           max_runs: int = MAX_RUNS, max_seconds: float = MAX_SECONDS) -> GoalSearch:
    """Look for final states the verifier accepts, starting from s0 (module docstring).

    `task`: the task's text; strings it quotes give the surface form of values the verifier compares
    only after normalising (lower case, spaces), so a target reads as an agent would write it.
    `max_runs` / `max_seconds` bound the search (a slow verifier spends seconds a run).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    s = _Search(sandbox, code, Path(s0), workdir, max_runs, task)
    deadline = time.monotonic() + max_seconds
    edits: list[Edit] = []
    best, state = s.observe(edits)
    tried: set[str] = set()
    result = GoalSearch()
    while best.verdict != "complete" and s.runs < max_runs and len(edits) < MAX_EDITS:
        if time.monotonic() > deadline:
            result.reason = f"no accepting state within {max_seconds:g} s ({s.runs} verifier runs)"
            break
        if best.verdict == "error" and not best.events:
            result.reason = f"the verifier does not run on the initial state: {best.detail or 'sandbox error'}"
            break
        improved = False
        s.proposer.path = edits
        for proposal in s.proposer.propose(best.events, state, edits):
            cand = extend(edits, proposal)
            key = "|".join(e.key() for e in cand)
            if key in tried or s.runs >= max_runs or time.monotonic() > deadline:
                continue
            tried.add(key)
            out, cand_state = s.observe(cand)
            if _better(out, best):
                edits, best, state, improved = cand, out, cand_state, True
                break
        if not improved:
            break
    result.runs = s.runs
    if best.verdict != "complete":
        result.partial = edits
        result.reason = result.reason or (
            f"no accepting state within {s.runs} verifier runs" if s.runs >= max_runs else
            f"no edit the verifier's observations suggest gets it further (after {len(edits)} edits, "
            f"{s.runs} runs)")
        return result
    edits = _minimal(s, edits)
    answer = answer_of(edits)
    a = s.states.materialize(edits, 0)
    if a is None or _plain_verdicts(s, [a], answer).get(a) != "complete":
        result.reason = "the state the observed run accepted is rejected by the verifier itself"
        return result
    edits, result.free_columns = _free_columns(s, edits, answer)
    b = s.states.materialize(edits, 1)
    result.second_from_other_donors = b is not None and _plain_verdicts(s, [b], answer).get(b) == "complete"
    result.accepting = [a, b if result.second_from_other_donors else a]
    result.answer, result.edits = answer, edits
    checks = [Path(s0)]
    for n in range(len(edits)):  # each prefix, and each state missing one edit
        for cut in (edits[:n], edits[:n] + edits[n + 1:]):
            p = s.states.materialize(cut, 0)
            if p is not None:
                checks.append(p)
    plain = _plain_verdicts(s, checks, answer)
    result.checked = [(p, plain[p]) for p in checks if p in plain] + [(p, "complete") for p in set(result.accepting)]
    keyed = s.states.materialize(edits, 0, other_keys=True)  # new rows' made-up text keys, otherwise
    if keyed is not None and s.states.renamed_any:
        verdict = _plain_verdicts(s, [keyed], answer).get(keyed)
        if verdict:  # accepted: a predicate naming our made-up key is dropped; rejected: a check like any other
            result.checked.append((keyed, verdict))
    result.runs = s.runs
    return result


def _free_columns(s: _Search, edits: list[Edit], answer: str | None) -> tuple[list[Edit], int]:
    """Give every column an inserted row copied from its donor an alternative value, and keep the
    alternative only where the verifier still accepts: B then differs from A exactly in the columns
    the verifier leaves free, which `predicate.extract` never uses as targets."""
    edits = [Edit(**{**asdict(e), "alt": dict(e.alt)}) for e in edits]
    free = 0
    pending = {id(e): e.alt for e in edits}
    for e in edits:
        e.alt = {}

    def passes() -> bool:
        trial = s.states.materialize(edits, 1)
        return trial is not None and _plain_verdicts(s, [trial], answer).get(trial) == "complete"

    for e in edits:  # updates that only had to be truthy keep their alternative only if it passes too
        if e.kind == "update" and pending[id(e)]:
            e.alt = pending[id(e)]
            if passes():
                free += len(e.alt)
            else:
                e.alt = {}
    for e in edits:  # text an observation set: does the verifier ignore case and spacing?
        for col, v in e.values.items():
            if e.kind in ("insert", "update") and isinstance(v, str) and v.strip() and col not in e.alt \
                    and v.upper() != v.lower():  # text with letters (dates and codes have no case to ignore)
                for form in (v.upper().replace(" ", "  ") + " ", f"{v.upper()} ", v.upper(), v.lower()):
                    if form != v:
                        e.alt = {**e.alt, col: form}
                        if passes():
                            free += 1
                            break
                        e.alt.pop(col)
    for e in edits:
        table = s.schema.table(e.table) if e.kind == "insert" else None
        if table is None:
            continue
        for col in s.schema.columns[table]:
            if col in e.values or col in s.schema.pk[table]:
                continue
            e.alt = {**e.alt, col: s.states.alternative(table, col, e)}
            if passes():
                free += 1
            else:
                e.alt.pop(col)
    return edits, free


def _minimal(s: _Search, edits: list[Edit]) -> list[Edit]:
    """Drop, one at a time from the last, every edit without which the verifier still accepts."""
    i = len(edits) - 1
    while i >= 0 and s.runs < s.max_runs + 2 * MAX_EDITS:
        trial = edits[:i] + edits[i + 1:]
        out, _ = s.observe(trial)
        if out.verdict == "complete":
            edits = trial
        i -= 1
    return edits


def _plain_verdicts(s: _Search, states: list[Path], answer: str | None) -> dict[Path, str]:
    """The unobserved verifier's verdict on each state (infrastructure failures are left out)."""
    out = {}
    for p in states:
        v = s.sandbox.verify(s.code, str(s.s0), str(p), answer, 10.0)
        s.runs += 1
        if v.verdict in ("complete", "others"):
            out[p] = v.verdict
    return out
