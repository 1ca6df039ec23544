"""The SharedStorageConnector without a model: the entry store never hands out a bad, forged or
planted entry, never blocks on what is planted in its directory, keeps its files private and its
size bound, and the scheduler's side saves and loads exactly the right blocks (an emulated runner
writes each token's KV as a function of its token and position)."""

from __future__ import annotations

import itertools
import os
import stat
import threading
import time

import pytest
import torch

from tests.helpers.core_utils import fake_runner_output, make_request
from engine.config import KVTransferConfig, SchedulerConfig
from engine.core.kv_cache import KVCacheManager, hash_block
from engine.core.request import RequestStatus
from engine.core.scheduler import Scheduler
from engine.kv_transfer.entry import HEADER_SIZE, EntryLayout, encode_header
from engine.kv_transfer.shared_storage import SharedStorageConnector
from engine.kv_transfer.store import BlockStore
from engine.kv_transfer import store_dir
from engine.kv_transfer.store_dir import SECRET_NAME, StoreDir
from tests.helpers.kv_transfer_utils import NOBODY, call_within, kv_config


# ---------------------------------------------------------------- the store, entry by entry
LAYOUT = EntryLayout(model_id="m", dtype="float32", block_size=4, num_layers=2, num_kv_heads=1, head_dim=8)


def payload(i: int) -> memoryview:
    return memoryview(bytes([i % 251]) * LAYOUT.payload_size)


def digest(i: int) -> bytes:
    return hash_block(b"", [i] * 4)


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_an_entry_round_trips_through_a_temporary_file_and_a_rename(tmp_path):
    store = BlockStore(str(tmp_path), LAYOUT, max_bytes=1 << 20)
    assert store.load(digest(1)) is None and not store.contains(digest(1))
    store.save(digest(1), payload(1))
    assert bytes(store.load(digest(1))) == bytes(payload(1))
    name = os.path.basename(store.entry_path(digest(1)))
    assert sorted(os.listdir(tmp_path)) == sorted([name, SECRET_NAME])  # no temporary file left
    assert os.path.getsize(store.entry_path(digest(1))) == HEADER_SIZE + LAYOUT.payload_size
    assert store.load(digest(2)) is None


def test_entries_and_the_secret_are_0600_whatever_the_umask_and_names_say_nothing_without_it(tmp_path):
    old = os.umask(0)
    try:
        store = BlockStore(str(tmp_path / "new"), LAYOUT, max_bytes=1 << 20)
        store.save(digest(1), payload(1))
    finally:
        os.umask(old)
    assert mode(tmp_path / "new") == 0o700
    assert mode(store.entry_path(digest(1))) == 0o600 and mode(tmp_path / "new" / SECRET_NAME) == 0o600
    assert os.path.getsize(tmp_path / "new" / SECRET_NAME) == 32
    # A name is keyed with the store's secret: not the block hash, and another store's differs.
    name = os.path.basename(store.entry_path(digest(1)))
    assert digest(1).hex()[:8] not in name
    other = BlockStore(str(tmp_path / "other"), LAYOUT, max_bytes=1 << 20)
    assert os.path.basename(other.entry_path(digest(1))) != name
    again = BlockStore(str(tmp_path / "new"), LAYOUT, max_bytes=1 << 20)  # the same secret is read back
    assert again.entry_path(digest(1)) == store.entry_path(digest(1))
    assert bytes(again.load(digest(1))) == bytes(payload(1))


def test_engines_opening_a_new_store_at_once_agree_on_one_secret(tmp_path):
    for k in range(20):  # a racy create (rename, not link) disagreed in ~3 of 10 here
        barrier, got = threading.Barrier(4), []

        def open_store(path=str(tmp_path / f"s{k}"), barrier=barrier):
            barrier.wait()
            got.append(StoreDir(path).secret)

        threads = [threading.Thread(target=open_store) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(got) == 4 and len(set(got)) == 1
        assert sorted(os.listdir(tmp_path / f"s{k}")) == [SECRET_NAME]  # no temporary file left


def test_an_entry_forged_without_the_secret_is_a_miss(tmp_path):
    store = BlockStore(str(tmp_path), LAYOUT, max_bytes=1 << 20)
    poison = payload(7)
    for key in (b"", bytes(32), os.urandom(32)):  # a guessed key: the format and the block are public
        with open(store.entry_path(digest(1)), "wb") as f:
            f.write(encode_header(LAYOUT, digest(1), poison, key) + bytes(poison))
        assert store.load(digest(1)) is None
    store.save(digest(1), poison)  # the same bytes with the store's own key: a hit
    assert bytes(store.load(digest(1))) == bytes(poison)


@pytest.mark.parametrize(
    "plant", ["fifo", "symlink_to_an_entry", "symlink_to_a_fifo", "directory", "another_users_entry", "device"]
)
def test_anything_but_a_regular_file_of_ours_at_an_entry_name_is_a_miss_and_never_blocks(tmp_path, plant):
    store = BlockStore(str(tmp_path / "kv"), LAYOUT, max_bytes=1 << 20)
    store.save(digest(1), payload(1))
    name = store.entry_path(digest(1))
    if plant == "symlink_to_an_entry":  # a whole, valid entry of this block, but reached through a link
        os.rename(name, tmp_path / "outside")
        os.symlink(tmp_path / "outside", name)
    elif plant != "another_users_entry":
        os.unlink(name)
    if plant == "fifo":
        os.mkfifo(name, 0o600)
    elif plant == "symlink_to_a_fifo":
        os.mkfifo(tmp_path / "fifo", 0o600)
        os.symlink(tmp_path / "fifo", name)
    elif plant == "directory":
        os.mkdir(name)
    elif plant == "another_users_entry":
        os.chown(name, NOBODY, NOBODY)
    elif plant == "device":
        try:
            os.mknod(name, 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero: reads never end
        except PermissionError:
            pytest.skip("no CAP_MKNOD here to make a device node")
    assert call_within(60, name, lambda: store.load(digest(1))) is None
    assert not store.contains(digest(1))
    if plant != "directory":
        store.save(digest(1), payload(1))  # a save replaces the planted name with an entry of ours
        assert bytes(store.load(digest(1))) == bytes(payload(1)) and mode(name) == 0o600


@pytest.mark.parametrize("damage", ["flip_payload", "flip_header", "truncate", "append", "empty"])
def test_a_damaged_entry_is_a_miss(tmp_path, damage):
    store = BlockStore(str(tmp_path), LAYOUT, max_bytes=1 << 20)
    store.save(digest(1), payload(1))
    path = store.entry_path(digest(1))
    data = bytearray(open(path, "rb").read())
    if damage == "flip_payload":
        data[-1] ^= 1
    elif damage == "flip_header":
        data[60] ^= 1  # block_size
    elif damage == "truncate":
        del data[-1]
    elif damage == "append":
        data.append(0)
    else:
        data.clear()
    open(path, "wb").write(data)
    assert store.load(digest(1)) is None


@pytest.mark.parametrize(
    "change",
    [
        dict(model_id="other"),
        dict(dtype="bfloat16", head_dim=16),
        dict(block_size=8, num_layers=1),
        dict(num_kv_heads=2, head_dim=4),
    ],
)
def test_an_entry_written_for_another_model_or_geometry_is_a_miss_even_under_the_right_name(tmp_path, change):
    other = EntryLayout(**{**LAYOUT.__dict__, **change})
    assert other.payload_size == LAYOUT.payload_size  # so that only the header can tell them apart
    writer = BlockStore(str(tmp_path), other, max_bytes=1 << 20)
    writer.save(digest(1), memoryview(bytes(other.payload_size)))
    reader = BlockStore(str(tmp_path), LAYOUT, max_bytes=1 << 20)
    assert reader.load(digest(1)) is None  # a different name: the layouts share the directory
    os.rename(writer.entry_path(digest(1)), reader.entry_path(digest(1)))
    assert reader.load(digest(1)) is None  # and the header is checked, whatever the name
    writer.save(digest(2), memoryview(bytes(other.payload_size)))
    os.rename(writer.entry_path(digest(2)), writer.entry_path(digest(1)))
    assert reader.load(digest(1)) is None and writer.load(digest(1)) is None  # the wrong block


def test_the_size_bound_evicts_the_least_recently_used_entries(tmp_path):
    entry = HEADER_SIZE + LAYOUT.payload_size
    store = BlockStore(str(tmp_path), LAYOUT, max_bytes=4 * entry + entry // 2)
    for i in range(4):
        store.save(digest(i), payload(i))
        os.utime(store.entry_path(digest(i)), (1000 + i, 1000 + i))  # an explicit order of use
    assert store.load(digest(0)) is not None  # a hit makes entry 0 the most recently used
    (tmp_path / ".tmp-dead.kv").write_bytes(b"x")  # left by a killed writer long ago
    os.utime(tmp_path / ".tmp-dead.kv", (1000, 1000))
    (tmp_path / "notes.txt").write_text("not an entry")
    os.symlink(store.entry_path(digest(1)), tmp_path / "link.kv")  # not a regular file: not counted
    store.save(digest(4), payload(4))  # 5 entries > 4.5: evict down to 90% of the bound
    left = {i for i in range(5) if store.contains(digest(i))}
    assert left == {0, 2, 3, 4}  # 4 entries: within 90% of the bound
    assert (tmp_path / "notes.txt").exists() and not (tmp_path / ".tmp-dead.kv").exists()
    assert (tmp_path / SECRET_NAME).exists() and os.path.islink(tmp_path / "link.kv")
    assert all(bytes(store.load(digest(i))) == bytes(payload(i)) for i in left)


# ---------------------------------------------------------------- the scheduler's side, no model
SMALL = EntryLayout(model_id="m", dtype="float32", block_size=4, num_layers=2, num_kv_heads=1, head_dim=4)


def connector(path, role: str, **extra):
    return SharedStorageConnector(KVTransferConfig(**kv_config(path, role, **extra)), SMALL)


def scheduler_with(conn, num_blocks: int = 64, budget: int = 64, caching: bool = True):
    config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=budget, enable_chunked_prefill=True, policy="fcfs")
    return Scheduler(config, KVCacheManager(num_blocks, 4, caching), 256, kv_connector=conn)


def emulated_step(scheduler, kv):
    """The runner's part of a step without a model: load, write each computed token's KV as
    (its token id, its position) into every layer, save, sample token 7. Returns the step's
    SchedulerOutput and its block tables (a finished request's blocks are freed after)."""
    sched = scheduler.schedule()
    tables = {req.request_id: list(req.block_ids) for req in sched.requests}
    meta = sched.kv_connector_metadata
    if meta is not None:
        scheduler.kv_connector.start_load_kv(kv, meta)
    for req, n in zip(sched.requests, sched.num_scheduled_tokens):
        for p in range(req.num_computed_tokens, req.num_computed_tokens + n):
            kv[:, req.block_ids[p // 4], p % 4] = float(req.all_token_ids[p] * 1000 + p)
    if meta is not None:
        scheduler.kv_connector.save_kv(kv, meta)
    scheduler.update_from_output(sched, fake_runner_output(sched))
    return sched, tables


def expected_kv(req, num_tokens: int):
    return torch.tensor([float(t * 1000 + p) for p, t in enumerate(req.all_token_ids[:num_tokens])])


def test_a_producer_saves_each_prompt_block_once_as_chunks_complete_it(tmp_path):

    producer = scheduler_with(connector(tmp_path, "kv_producer"), budget=6)  # chunks of 6 tokens
    kv = torch.zeros(2, 64, 4, 8)
    req = make_request("a", list(range(100, 118)), max_tokens=3)  # 18 tokens: 4 full blocks
    producer.add_request(req)
    saved = []
    while producer.has_unfinished_requests():
        sched, tables = emulated_step(producer, kv)
        meta = sched.kv_connector_metadata
        saved += [tables["a"].index(b) for b, _ in meta.saves] if meta else []
    assert saved == [0, 1, 2, 3]  # in order, once each, and no block holding output tokens
    assert len([n for n in os.listdir(tmp_path) if n.endswith(".kv")]) == 4

    consumer = scheduler_with(connector(tmp_path, "kv_consumer"))
    kv2 = torch.zeros(2, 64, 4, 8)
    consumer.add_request(make_request("local", list(range(100, 109)), max_tokens=1))  # blocks 0-1, cached here
    consumer.add_request(make_request("other", list(range(900, 909)), max_tokens=1))  # so block ids differ
    emulated_step(consumer, kv2)
    twin = make_request("b", list(range(100, 118)), max_tokens=1)
    consumer.add_request(twin)
    sched, tables = emulated_step(consumer, kv2)
    assert sched.num_scheduled_tokens == [2] and twin.num_cached_tokens == 16  # 8 local + 8 loaded
    assert consumer.make_stats().prefix_cache_hits == 8
    got = kv2[0, torch.tensor(tables["b"])].reshape(-1, 8)[:18, 0]
    assert torch.equal(got, expected_kv(twin, 18))  # local blocks 0-1, loaded 2-3, computed tokens 16-17


def test_a_consumer_request_waiting_for_blocks_is_loaded_when_admitted_and_forgotten_when_aborted(tmp_path):

    producer = scheduler_with(connector(tmp_path, "kv_producer"))
    producer.add_request(make_request("p", list(range(200, 217)), max_tokens=1))  # 17 tokens: 4 blocks saved
    emulated_step(producer, torch.zeros(2, 64, 4, 8))

    conn = connector(tmp_path, "kv_consumer")
    consumer = scheduler_with(conn, num_blocks=7, caching=False)  # only the connector saves work here
    kv = torch.zeros(2, 7, 4, 8)
    hog = make_request("hog", list(range(300, 312)), max_tokens=4)  # 3 blocks, then a 4th to decode
    wanted = make_request("w", list(range(200, 217)), max_tokens=1)  # needs 5 blocks, 4 of them loaded
    consumer.add_request(hog)
    consumer.add_request(wanted)
    emulated_step(consumer, kv)
    assert wanted.status is RequestStatus.WAITING  # no room: its entries wait with it (read once)
    while wanted.status is RequestStatus.WAITING:
        sched, tables = emulated_step(consumer, kv)
    assert wanted.num_cached_tokens == 16 and sched.num_scheduled_tokens[-1] == 1
    assert torch.equal(kv[1, torch.tensor(tables["w"])].reshape(-1, 8)[:17, 3], expected_kv(wanted, 17))

    late = make_request("late", list(range(200, 217)) + [5], max_tokens=1)
    consumer.add_request(make_request("hog2", list(range(400, 416)), max_tokens=4))  # up to 5 of 7 blocks
    consumer.add_request(late)
    emulated_step(consumer, kv)
    assert late.status is RequestStatus.WAITING  # its entries are read and held
    consumer.finish_requests(["late"], RequestStatus.FINISHED_ABORTED)
    for name in os.listdir(tmp_path):
        os.unlink(tmp_path / name)
    again = make_request("late", list(range(200, 217)) + [5], max_tokens=1)  # the id reused
    consumer.add_request(again)
    while again.status is RequestStatus.WAITING:
        emulated_step(consumer, kv)
    assert again.num_cached_tokens == 0  # what was read for the aborted request went with it


def chained_hashes(request, num_tokens: int) -> list[bytes]:
    """The prefix cache's digests of the request's full blocks of 4 (the scheduler's BlockHashes)."""
    ids, digests = request.all_token_ids, [b""]
    for i in range(num_tokens // 4):
        digests.append(hash_block(digests[-1], ids[i * 4 : (i + 1) * 4]))
    return digests[1:]


def test_a_stalled_file_operation_costs_one_deadline_then_the_store_is_skipped_until_it_returns(tmp_path, monkeypatch):
    producer = scheduler_with(connector(tmp_path, "kv_producer"))
    tokens = list(range(500, 517))  # 17 tokens: 4 blocks saved
    producer.add_request(make_request("p", tokens, max_tokens=1))
    emulated_step(producer, torch.zeros(2, 64, 4, 8))

    conn = connector(tmp_path, "kv_consumer", io_timeout_s=0.5)
    fifo = conn.store.entry_path(chained_hashes(make_request("x", tokens), 16)[1])
    os.unlink(fifo)
    os.mkfifo(fifo, 0o600)
    # A filesystem whose open can wait in the kernel (a network mount whose server is away): a FIFO
    # opened without O_NONBLOCK waits just so, for a writer.
    monkeypatch.setattr(store_dir, "_OPEN_READ", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    first = call_within(60, fifo, lambda: conn.get_num_new_matched_tokens(make_request("a", tokens), 0, chained_hashes))
    assert first == 0  # the deadline passed: nothing loaded, the request is computed
    assert conn.get_num_new_matched_tokens(make_request("b", tokens), 0, chained_hashes) == 0  # still stalled
    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # the "server" is back: the stuck open returns
    os.unlink(fifo)
    deadline = time.monotonic() + 60
    for k in itertools.count():  # the store is used again once the stalled operation has returned
        got = conn.get_num_new_matched_tokens(make_request(f"c{k}", tokens), 0, chained_hashes)
        if got or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert got == 4  # block 0; block 1 is gone
