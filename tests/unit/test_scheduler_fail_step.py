"""Scheduler.fail_step: the requests of a step that raised end with FINISHED_ERROR and give
back every KV block; the others go on (plain CPU objects, no model)."""

from __future__ import annotations

from tests.helpers.core_utils import make_request, make_requests, make_scheduler, step
from engine.core.request import RequestStatus


def test_a_failed_batch_ends_its_requests_frees_their_blocks_and_spares_the_waiting():
    s = make_scheduler(max_num_seqs=2)
    reqs = make_requests(3, prompt_len=40)
    for r in reqs:
        s.add_request(r)
    sched = s.schedule()  # the model run of this batch raises
    assert [r.request_id for r in sched.requests] == ["0", "1"]
    assert s.fail_step(sched) == ["0", "1"]
    assert [r.status for r in reqs] == [RequestStatus.FINISHED_ERROR] * 2 + [RequestStatus.WAITING]
    assert not s.running and list(s.waiting) == [reqs[2]] and set(s.requests) == {"2"}
    assert s.kv_cache.usage == 0.0 and {"0", "1"} <= s.finished_req_ids
    _, outputs = step(s)  # the next step runs the one left
    assert [o.request_id for o in outputs] == ["2"]


def test_ids_the_runner_never_saw_are_handed_to_the_next_batch():
    s = make_scheduler()
    s.add_request(make_request("done", [5] * 20, max_tokens=1))
    step(s)  # "done" finishes: the next batch tells the runner to drop its state
    s.add_request(make_request("next", [6] * 20))
    sched = s.schedule()
    assert sched.finished_req_ids == {"done"}
    s.fail_step(sched)  # the runner raised before it dropped "done"
    assert {"done", "next"} <= s.finished_req_ids


def test_a_failed_schedule_ends_every_request_it_held():
    s = make_scheduler(max_num_seqs=1)
    s.add_request(make_request("running", [7] * 20))
    s.add_request(make_request("waiting", [8] * 20))
    step(s)
    assert s.fail_step(None) == ["running", "waiting"]  # schedule() raised: no batch to blame
    assert not s.running and not len(s.waiting) and not s.requests and s.kv_cache.usage == 0.0
