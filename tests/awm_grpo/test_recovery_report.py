"""The recovery comparison's statistics and plots (awm_grpo.recovery.report): known values, real PNGs."""

from __future__ import annotations

import math

import pytest

from awm_grpo.recovery import report


@pytest.mark.parametrize("t, df, p", [(12.706, 1, 0.05), (4.303, 2, 0.05), (2.228, 10, 0.05), (0.0, 3, 1.0),
                                      (9.925, 2, 0.01)])
def test_student_t_matches_the_table_values(t, df, p):
    assert report.student_t_two_sided(t, df) == pytest.approx(p, abs=2e-4)


def test_student_t_with_two_degrees_of_freedom_has_a_closed_form():
    for t in (0.3, 1.0, 2.5, 7.0):
        assert report.student_t_two_sided(t, 2) == pytest.approx(1 - t / math.sqrt(t * t + 2), abs=1e-8)


def test_paired_t_over_seeds():
    r = report.paired_t([0.5, 0.6, 0.7], [0.3, 0.3, 0.5])  # d = 0.2, 0.3, 0.2
    assert r["diff"] == pytest.approx(0.7 / 3) and r["n"] == 3
    assert r["t"] == pytest.approx((0.7 / 3) / (math.sqrt(1 / 300) / math.sqrt(3)))
    assert 0 < r["p"] < 0.05
    assert report.paired_t([0.1, 0.2], [0.1, 0.2])["p"] == 1.0  # no difference, no spread
    assert report.paired_t([0.3, 0.3], [0.1, 0.1])["p"] == 0.0  # a constant difference
    assert math.isnan(report.paired_t([0.3], [0.1])["p"])


def test_sign_flip_is_reproducible_and_calibrated():
    ten_wins = [0.5] * 10  # exact p = 2 / 2**10 for a two-sided test
    r = report.sign_flip(ten_wins, rounds=20000, seed=1)
    assert r["p"] == report.sign_flip(ten_wins, rounds=20000, seed=1)["p"]
    assert r["p"] == pytest.approx(2 / 1024, abs=0.002) and r["diff"] == 0.5
    assert report.sign_flip([0.0, 0.0])["p"] == 1.0
    assert report.sign_flip([0.2, -0.2, 0.1, -0.1])["p"] > 0.9


def test_per_handover_outcomes_and_their_pooled_differences():
    recs = [{"scenario": "a", "task_idx": 0, "verdict": "complete"}, {"scenario": "a", "task_idx": 0, "verdict": "x"},
            {"scenario": "a", "task_idx": 1, "verdict": "complete", "infra_error": "boom"}]
    items = report.per_item_success(recs)
    assert items == {"a/0": [1.0, 0.0]}  # an infrastructure failure is no outcome
    arm = [{"a/0": [1.0, 1.0], "a/1": [0.0]}, {"a/0": [0.0, 1.0], "a/1": [1.0]}]
    ref = [{"a/0": [0.0, 0.0], "a/1": [0.0]}, {"a/0": [0.0, 0.0]}]
    assert report.handover_diffs(arm, ref) == pytest.approx([0.75, 0.5])


def test_learning_curve_keeps_damaged_starts_apart_and_smooths():
    recs = [{"step": 0, "verdict": "complete", "handover": {"kind": "wrong_write"}},
            {"step": 0, "verdict": "others", "handover": {"kind": "wrong_write"}},
            {"step": 0, "verdict": "complete", "handover": None},
            {"step": 1, "verdict": "complete", "handover": {"kind": "wrong_write"}}]
    assert report.learning_curve(recs, handovers=True) == {0: 0.5, 1: 1.0}
    assert report.learning_curve(recs, handovers=False) == {0: 1.0}
    assert report.smooth({0: 0.0, 1: 1.0, 2: 1.0}, 2) == {0: 0.0, 1: 0.5, 2: 1.0}


def test_markdown_table_and_plots(tmp_path):
    final = {"b1": {"recovery_success": (0.2, 0.05, 3), "SR_ordinary": (0.5, 0.1, 3)},
             "ours": {"recovery_success": (0.4, 0.1, 3), "SR_ordinary": (0.5, 0.0, 3)}}
    tests = {"ours": {"recovery_seeds": {"diff": 0.2, "p": 0.03, "t": 5.0, "n": 3},
                      "recovery_handovers": {"p": 0.001, "diff": 0.2}, "ordinary_seeds": None}}
    md = report.markdown_table(final, ("recovery_success", "SR_ordinary"), tests)
    assert "| ours | 0.400 +- 0.100 | 0.500 +- 0.000 | +0.200, p=0.030 | p=0.001 | - |" in md
    assert "| b1 | 0.200 +- 0.050 | 0.500 +- 0.100 | - | - | - |" in md
    curves = {"recovery": {"b1": [{0: 0.1, 1: 0.2}, {0: 0.0, 1: 0.3}], "ours": [{0: 0.1, 2: 0.5}]},
              "ordinary": {"b1": [{0: 0.5}], "ours": [{}]}}
    for path in report.plot(tmp_path, curves, final, ("recovery_success", "SR_ordinary"), "title"):
        assert path.read_bytes()[:4] == b"\x89PNG" and path.stat().st_size > 5000
