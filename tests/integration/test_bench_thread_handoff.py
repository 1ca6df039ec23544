"""benchmarks/thread_handoff.py runs each wait policy in a process of its own and reports the
per-call times on one and two threads (figures are the harness's business, not asserted here)."""

from __future__ import annotations

import pytest

from benchmarks import thread_handoff


@pytest.mark.parametrize("policy", sorted(thread_handoff.POLICIES))
def test_each_policy_reports_one_and_two_thread_calls(policy):
    got = thread_handoff._case(policy, gap_us=0.0, calls=3)
    assert set(got) == {"us_1t", "us_2t", "ratio_2t_1t"}
    assert got["us_1t"] > 0 and got["us_2t"] > 0
    assert got["ratio_2t_1t"] == pytest.approx(got["us_2t"] / got["us_1t"])
