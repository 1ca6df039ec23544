"""KVCacheManager: allocation, prefix caching, reference counts and LRU eviction."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.core_utils import make_request
from engine.core.kv_cache import KVCacheManager

BS = 4


def admit(kv: KVCacheManager, req, num_new_tokens=None) -> bool:
    """What the scheduler does for a waiting request: look up hits, then allocate the rest."""
    hits, num_hit = kv.get_computed_blocks(req)
    n = req.num_tokens - num_hit if num_new_tokens is None else num_new_tokens
    if not kv.allocate_slots(req, n, hits):
        return False
    req.num_computed_tokens = num_hit
    return True


def compute(kv: KVCacheManager, req, n=None) -> None:
    """Pretend the runner computed ``n`` (default: all remaining) tokens."""
    req.num_computed_tokens += req.num_tokens - req.num_computed_tokens if n is None else n
    kv.cache_blocks(req)


def free_order(kv: KVCacheManager) -> list[int]:
    return [b.block_id for b in kv.free_queue]


def test_allocates_ceil_of_tokens_over_block_size_and_frees_all():
    kv = KVCacheManager(10, BS)
    req = make_request("a", list(range(10)))
    assert admit(kv, req)
    assert len(req.block_ids) == 3 and kv.num_free_blocks == 7
    assert abs(kv.usage - 0.3) < 1e-9
    kv.free(req)
    assert req.block_ids == [] and kv.num_free_blocks == 10


def test_decode_allocates_a_block_only_when_the_last_one_is_full():
    kv = KVCacheManager(10, BS, enable_caching=False)
    req = make_request("a", list(range(4)))
    assert admit(kv, req)
    compute(kv, req)
    assert len(req.block_ids) == 1
    req.append_output_token(9)  # position 4 starts block 2
    assert kv.allocate_slots(req, 1) and len(req.block_ids) == 2
    compute(kv, req)
    req.append_output_token(9)
    assert kv.allocate_slots(req, 1) and len(req.block_ids) == 2


def test_failed_allocation_changes_nothing():
    kv = KVCacheManager(3, BS)
    a, b = make_request("a", list(range(8))), make_request("b", list(range(50, 58)))
    assert admit(kv, a)
    before = free_order(kv)
    assert not admit(kv, b)
    assert b.block_ids == [] and free_order(kv) == before


def test_shared_prefix_hits_full_blocks_and_shares_them():
    kv = KVCacheManager(20, BS)
    a = make_request("a", list(range(11)))  # blocks [0..3] [4..7] + partial
    assert admit(kv, a)
    compute(kv, a)
    b = make_request("b", list(range(8)) + [99, 98, 97])
    hits, num_hit = kv.get_computed_blocks(b)
    assert num_hit == 8 and [h.block_id for h in hits] == a.block_ids[:2]
    assert admit(kv, b)
    assert b.block_ids[:2] == a.block_ids[:2] and b.block_ids[2] != a.block_ids[2]
    assert [kv.blocks[i].ref_cnt for i in b.block_ids] == [2, 2, 1]


def test_last_token_is_always_left_to_compute():
    kv = KVCacheManager(20, BS)
    a = make_request("a", list(range(8)))
    assert admit(kv, a)
    compute(kv, a)
    b = make_request("b", list(range(8)))  # same prompt, exactly two full blocks
    assert kv.get_computed_blocks(b)[1] == 4


def test_hash_chains_the_parent_so_equal_blocks_after_different_prefixes_miss():
    kv = KVCacheManager(20, BS)
    a = make_request("a", [1, 1, 1, 1, 5, 6, 7, 8, 0])
    assert admit(kv, a)
    compute(kv, a)
    b = make_request("b", [2, 2, 2, 2, 5, 6, 7, 8, 0])
    assert kv.get_computed_blocks(b) == ([], 0)


def test_freed_cached_blocks_are_revived_by_a_later_hit():
    kv = KVCacheManager(6, BS)
    a = make_request("a", list(range(9)))
    assert admit(kv, a)
    compute(kv, a)
    shared = a.block_ids[:2]
    kv.free(a)
    assert kv.num_free_blocks == 6
    b = make_request("b", list(range(8)) + [42])
    assert admit(kv, b)
    assert b.block_ids[:2] == shared and kv.num_free_blocks == 3
    assert all(kv.blocks[i].ref_cnt == 1 for i in b.block_ids)


def test_eviction_takes_uncached_blocks_first_then_least_recently_freed_tail_first():
    kv = KVCacheManager(8, BS)
    a = make_request("a", list(range(10)))  # 2 full blocks + 1 partial (never cached)
    assert admit(kv, a)
    compute(kv, a)
    full0, full1, partial = a.block_ids
    kv.free(a)
    order = free_order(kv)
    assert order[0] == partial  # unregistered: reused first
    assert order[-2:] == [full1, full0]  # a's tail is evicted before its head
    big = make_request("big", list(range(100, 100 + 4 * 7)))  # takes 7 blocks: evicts full1, keeps full0
    assert admit(kv, big)
    assert full1 in big.block_ids and full0 not in big.block_ids
    c = make_request("c", list(range(10)))
    assert kv.get_computed_blocks(c)[1] == 4  # only the first block is still cached


def test_concurrent_identical_blocks_register_once():
    kv = KVCacheManager(20, BS)
    a, b = make_request("a", list(range(9))), make_request("b", list(range(9)))
    assert admit(kv, a) and admit(kv, b)  # neither is computed yet: no hit, separate blocks
    compute(kv, a)
    compute(kv, b)
    assert len(kv.cached) == 2
    assert {kv.cached[h].block_id for h in a.block_hashes} == set(a.block_ids[:2])


def test_prompt_logprobs_requests_skip_the_cache():
    kv = KVCacheManager(20, BS)
    a = make_request("a", list(range(9)))
    assert admit(kv, a)
    compute(kv, a)
    b = make_request("b", list(range(9)), prompt_logprobs=1)
    assert kv.get_computed_blocks(b) == ([], 0)


def test_disabled_caching_never_hits():
    kv = KVCacheManager(20, BS, enable_caching=False)
    a = make_request("a", list(range(9)))
    assert admit(kv, a)
    compute(kv, a)
    assert kv.get_computed_blocks(make_request("b", list(range(9)))) == ([], 0) and not kv.cached


def test_reset_prefix_cache_refused_while_blocks_are_in_use():
    kv = KVCacheManager(20, BS)
    a = make_request("a", list(range(9)))
    assert admit(kv, a)
    compute(kv, a)
    assert not kv.reset_prefix_cache() and kv.cached
    kv.free(a)
    assert kv.reset_prefix_cache() and not kv.cached
    assert kv.get_computed_blocks(make_request("b", list(range(9)))) == ([], 0)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.lists(st.integers(0, 2), min_size=1, max_size=14)), min_size=1, max_size=40
    )
)
def test_invariants_hold_under_random_admit_compute_free(ops):
    """Ref counts equal the number of block tables holding a block; free blocks have none;
    every cached digest points at a block carrying it."""
    kv = KVCacheManager(12, BS)
    live: dict[str, object] = {}
    for i, (slot, prompt) in enumerate(ops):
        key = str(slot)
        if key in live:
            kv.free(live.pop(key))
        else:
            req = make_request(f"{key}-{i}", prompt)
            if admit(kv, req):
                compute(kv, req)
                live[key] = req
        refs = [0] * kv.num_blocks
        for req in live.values():
            for block_id in req.block_ids:
                refs[block_id] += 1
        assert refs == [b.ref_cnt for b in kv.blocks]
        assert set(free_order(kv)) == {i for i, r in enumerate(refs) if r == 0}
        assert kv.num_free_blocks == refs.count(0)
        assert all(block.block_hash == h for h, block in kv.cached.items())
