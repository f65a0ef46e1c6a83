"""Recovery metrics on hand-built episodes whose values a person can count."""

from __future__ import annotations

from awm_grpo.recovery.metrics import (
    EpisodeRecord,
    TableChange,
    TurnRecord,
    flat_metrics,
    next_action,
    progress_credit,
    progress_pattern,
    recovery_metrics,
)


def read(tool="get_x", relevant=True, phi=0.0, **kw):
    return TurnRecord(tool=tool, arguments=kw.get("args", {}), label="read", phi_before=phi, phi_after=phi,
                      relevant_read=relevant, error=kw.get("error", False))


def write(tool, before, after, args=None, error=False, changes=None):
    return TurnRecord(tool=tool, arguments=args or {}, label="update", phi_before=before, phi_after=after,
                      error=error, changes=changes or {})


def final(phi):
    return TurnRecord(tool=None, is_final_answer=True, phi_before=phi, phi_after=phi)


def episodes():
    # 1: dip and recover, success: write ok (0 -> .5), wrong write (.5 -> 0), read, repair (0 -> 1), answer
    e1 = EpisodeRecord("state_mutating", "complete", [
        write("set", 0.0, 0.5, {"v": 1}, changes={"t": TableChange(updated=["1"])}),
        write("set", 0.5, 0.0, {"v": 2}, changes={"t": TableChange(updated=["1"])}),
        read("get", phi=0.0),
        write("set", 0.0, 1.0, {"v": 3}, changes={"t": TableChange(updated=["1"])}),
        final(1.0)], preservation_end=[1.0, 1.0])
    # 2: explicit error, blind retry (same call, errors again), then stops early: premature stop
    e2 = EpisodeRecord("state_mutating", "others", [
        write("add", 0.0, 0.0, {"a": 1}, error=True),
        write("add", 0.0, 0.0, {"a": 1}, error=True),
        final(0.0)], preservation_end=[1.0, 0.0])
    # 3: same insert twice (duplicate effect), success, no dip
    e3 = EpisodeRecord("state_mutating", "complete", [
        write("add", 0.0, 1.0, {"a": 1}, changes={"t": TableChange(inserted=["5"], inserted_fingerprints=["h"])}),
        write("add", 1.0, 1.0, {"a": 1}, changes={"t": TableChange(inserted=["6"], inserted_fingerprints=["h"])}),
        final(1.0)], preservation_end=[1.0])
    # 4: info seeking, read then answer, fails (flat)
    e4 = EpisodeRecord("info_seeking", "others", [read("get"), final(0.0)])
    # 5: infrastructure failure: excluded from every rate, counted
    e5 = EpisodeRecord("info_seeking", "judge_error", [read("get")], infra_failure=True)
    return [e1, e2, e3, e4, e5]


def test_metrics_by_hand():
    m = recovery_metrics(episodes())
    a = m["all"]
    assert a["episodes"] == 4 and a["infra_failures"] == 1
    assert a["SR"] == {"rate": 0.5, "n": 2, "of": 4}
    assert a["RR"] == {"rate": 0.5, "n": 1, "of": 2}  # troubled: e1 (dip), e2 (error); e1 succeeds
    assert a["DRR_all"]["n"] == 1 and a["DRR_dipped"] == {"rate": 1.0, "n": 1, "of": 1}
    assert a["DSR"] == {"rate": round(1 / 7, 4), "n": 1, "of": 7}  # 7 write turns, one negative
    assert a["duplicate_effect_count"] == 1
    assert a["contradictory_update_count"] == 2  # row t/1 rewritten at turns 2 and 4 of e1
    assert a["irreversible_damage_rate"] == {"rate": round(1 / 3, 4), "n": 1, "of": 3}
    assert a["premature_stop_rate"] == {"rate": 0.5, "n": 2, "of": 4}  # e2 and e4 answered with Phi < 1
    # after e1's dip the next action is a relevant read; after e2's first error a blind retry
    assert a["verification_first_rate"] == {"rate": 0.5, "n": 1, "of": 2}
    assert a["post_error_next_action"] == {"blind_retry": 1, "argument_revision": 0, "verification": 1,
                                           "tool_switch": 0, "stop": 1}
    assert a["progress_patterns"]["dip_and_recover_success"] == 1
    assert a["progress_patterns"]["monotonic_success"] == 1
    assert a["progress_patterns"]["flat_fail"] == 2
    assert m["info_seeking"]["episodes"] == 1 and m["info_seeking"]["infra_failures"] == 1
    assert m["state_mutating"]["SR"]["rate"] == round(2 / 3, 4)


def test_patterns_and_next_actions():
    dmg = EpisodeRecord("state_mutating", "others", [write("a", 0.5, 0.25), write("b", 0.25, 0.0), final(0.0)])
    assert progress_pattern(dmg) == "continual_damage"
    rise = EpisodeRecord("state_mutating", "others", [write("a", 0.0, 0.5), final(0.5)])
    assert progress_pattern(rise) == "rise_fail"
    w = write("a", 0, 0, {"x": 1}, error=True)
    assert next_action(w, write("a", 0, 0, {"x": 2})) == "argument_revision"
    assert next_action(w, write("b", 0, 0)) == "tool_switch"
    assert next_action(w, None) == "stop"


def test_controlled_split_fields_and_flat_logging():
    ep = EpisodeRecord("state_mutating", "others", [write("a", 0.5, 0.0), read("get", phi=0.0),
                                                     write("a", 0.0, -0.0), write("b", 0.0, 0.0)],
                       handover_turn=1)
    m = recovery_metrics([ep])["all"]
    assert m["verification_first_rate"] == {"rate": 1.0, "n": 1, "of": 1}
    assert m["recovery_success"]["n"] == 0 and m["additional_damage"]["n"] == 0
    flat = flat_metrics(recovery_metrics([ep]))
    assert flat["state_mutating/verification_first_rate"] == 1.0 and "all/progress_patterns/flat_fail" in flat


def test_progress_credit_counts_tasks_whose_writes_moved_phi():
    def ep(task, turns, task_type="state_mutating", predicates=2, infra=False):
        return EpisodeRecord(task_type, "others", turns, infra_failure=infra, task=task, predicates=predicates)

    row = {"t": TableChange(updated=["1"])}
    eps = [
        ep("s#1", [read("get"), write("set", 0.0, 0.5, changes=row), final(0.5)]),  # credited (Phi up after a write)
        ep("s#1", [read("get"), final(0.0)]),  # same task, reads only
        ep("s#2", [write("add", 0.0, 0.0, changes=row), final(0.0)], predicates=1),  # DB changed, Phi did not
        ep("s#2", [write("add", 0.0, 1.0)], predicates=1, infra=True),  # infrastructure failure: left out
        ep("s#3", [write("add", None, None)], predicates=0),  # state-mutating but no predicates
        ep("s#4", [read("get"), final(0.0)], task_type="info_seeking", predicates=0),
        ep("s#5", [TurnRecord(tool="get", label="read", phi_before=0.0, phi_after=1.0)], predicates=3),  # no write
        ep("s#6", [write("del", 1.0, 0.5), final(0.5)], predicates=1),  # down counts too (no rows recorded)
        ep(None, [write("set", 0.0, 1.0)]),  # no task key: cannot be told apart, left out
    ]
    assert progress_credit(eps) == {
        "progress_sm_tasks": 5.0, "progress_tasks": 4.0, "progress_write_tasks": 2.0,  # s#1, s#2
        "progress_credit_tasks": 2.0,  # s#1, s#6
        "progress_credit_task_rate": 0.5, "progress_credit_sm_task_rate": 0.4,
        "progress_credit_episode_rate": 0.4}  # 2 of 5 scored episodes of s#1, s#2, s#5, s#6
    assert progress_credit([EpisodeRecord("state_mutating", "others", [write("a", 0.0, 1.0)], task="s#1")]) == {}
    only_info = progress_credit([ep("s#4", [read("get")], task_type="info_seeking", predicates=0)])
    assert only_info == {"progress_sm_tasks": 0.0, "progress_tasks": 0.0, "progress_write_tasks": 0.0,
                         "progress_credit_tasks": 0.0}
