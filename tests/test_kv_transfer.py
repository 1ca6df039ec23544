"""kv_transfer_config and the SharedStorageConnector: the config refuses bad values before any
process starts, the entry store never hands out a bad entry, and two engines (each an LLM with
its EngineCore process) share prompt KV through a directory with the same results.

The tiny dummy-weight model echoes its input token whatever the KV holds, so equal tokens alone
would not show that the loaded KV is right: the outputs' logprobs are compared too (zeroed KV
moves them by ~0.02; loaded KV matches computed KV to ~1e-6)."""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess

import msgspec
import pytest

from engine import LLM, SamplingParams
from engine.config import AsyncEngineArgs, EngineArgs, KVTransferConfig
from engine.core.kv_cache import hash_block
from engine.entrypoints.cli_args import add_engine_args, engine_args_from
from engine.kv_transfer.entry import HEADER_SIZE, EntryLayout
from engine.kv_transfer.store import BlockStore

TINY = dict(load_format="dummy", dtype="float32", max_model_len=1024, kv_cache_memory=16 << 20, num_threads=1,
            seed=0)
BLOCK = 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=3)
# Long prompts with no common prefix (so that no entry is shared between them): ~370 to ~760 tokens.
PROMPTS = [f"Inventory {k}: " + " ".join(f"item {i} weighs {i * 7 % 13} kg and costs {i * 11 % 17} euros."
                                        for i in range(n)) for k, n in enumerate((30, 45, 61))]


def kv_config(path, role: str, **extra) -> dict:
    return {"kv_connector": "SharedStorageConnector", "kv_role": role,
            "kv_connector_extra_config": {"shared_storage_path": str(path), **extra}}


def run(model: str, path, role: str, prompts=PROMPTS, **overrides):
    """Generate in a fresh LLM (and so a fresh EngineCore process) that is shut down after."""
    extra = overrides.pop("extra", {})
    llm = LLM(model=model, kv_transfer_config=kv_config(path, role, **extra), **{**TINY, **overrides})
    try:
        return llm.generate(prompts, GREEDY, use_tqdm=False)
    finally:
        llm.shutdown()


def assert_same_outputs(got, want) -> None:
    for g, w in zip(got, want, strict=True):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids
        for lp_g, lp_w in zip(g.outputs[0].logprobs, w.outputs[0].logprobs, strict=True):
            assert lp_g.keys() == lp_w.keys()
            for tok in lp_g:
                assert lp_g[tok].logprob == pytest.approx(lp_w[tok].logprob, abs=1e-4)


def full_blocks(output) -> int:
    """Prompt tokens a consumer can load: whole blocks, leaving at least one token to compute."""
    return (len(output.prompt_token_ids) - 1) // BLOCK * BLOCK


def entry_files(path, output) -> list[str]:
    """The store's file for each full prompt block of ``output``, in block order."""
    ids, digest, files = output.prompt_token_ids, b"", []
    for i in range(len(ids) // BLOCK):
        digest = hash_block(digest, ids[i * BLOCK:(i + 1) * BLOCK])
        files.append(glob.glob(os.path.join(path, digest.hex() + "-*.kv")))
    return files


@pytest.fixture(scope="module")
def produced(tiny_model_dir, tmp_path_factory):
    """A store written by a producer, with the producer's (computed) outputs."""
    path = tmp_path_factory.mktemp("kv-produced")
    return path, run(tiny_model_dir, path, "kv_producer")


@pytest.fixture
def store_copy(produced, tmp_path):
    path = tmp_path / "kv"
    shutil.copytree(produced[0], path)
    return path


# ---------------------------------------------------------------- the config
@pytest.mark.parametrize("config, field, cause", [
    ({"kv_connector": "NixlConnector", "kv_role": "kv_both"}, "kv_connector", msgspec.ValidationError),
    ({"kv_connector": "SharedStorageConnector", "kv_role": "kv_server"}, "kv_role", msgspec.ValidationError),
    ({"kv_connector": "SharedStorageConnector", "kv_role": 1}, "kv_role", msgspec.ValidationError),
    ({"kv_connector": "SharedStorageConnector", "kv_role": "kv_both"}, "shared_storage_path", msgspec.ValidationError),
    ({"kv_connector": "SharedStorageConnector", "kv_role": "kv_both", "kv_connector_extra_config": []},
     "kv_connector_extra_config", msgspec.ValidationError),
    (kv_config("{tmp}/x", "kv_both", max_bytes="1G"), "max_bytes", msgspec.ValidationError),
    ({**kv_config("{tmp}/x", "kv_both"), "kv_ip": "127.0.0.1"}, "kv_ip", msgspec.ValidationError),
    (kv_config("{tmp}/file", "kv_producer"), "shared_storage_path", OSError),
    ("SharedStorageConnector", "kv_transfer_config", msgspec.ValidationError),
])
def test_invalid_config_is_a_value_error_naming_the_field_before_any_process_starts(
        tiny_model_dir, tmp_path, monkeypatch, config, field, cause):
    (tmp_path / "file").write_text("not a directory")
    config = msgspec.json.decode(msgspec.json.encode(config).replace(b"{tmp}", str(tmp_path).encode()))

    def no_process(*args, **kwargs):
        raise AssertionError("a process was started for an invalid config")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    with pytest.raises(ValueError, match=field) as err:
        LLM(model=tiny_model_dir, kv_transfer_config=config, **TINY)
    assert isinstance(err.value.__cause__, cause)
    with pytest.raises(ValueError, match=field):
        AsyncEngineArgs(model=tiny_model_dir, kv_transfer_config=config, **TINY).create_engine_config()


def test_a_kv_transfer_config_object_is_checked_like_a_dict(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="kv_role"):
        KVTransferConfig(kv_connector="SharedStorageConnector", kv_role="kv_server")
    with pytest.raises(ValueError, match="kv_role") as err:  # no type check at construction: done later
        EngineArgs(model=tiny_model_dir, kv_transfer_config=KVTransferConfig(kv_role=3), **TINY).create_engine_config()
    assert isinstance(err.value.__cause__, msgspec.ValidationError)
    obj = KVTransferConfig(kv_connector="SharedStorageConnector", kv_role="kv_consumer",
                           kv_connector_extra_config={"shared_storage_path": str(tmp_path / "new" / "dir")})
    config = EngineArgs(model=tiny_model_dir, kv_transfer_config=obj, **TINY).create_engine_config()
    assert config.kv_transfer_config == obj and config.kv_transfer_config.is_kv_consumer
    assert os.path.isdir(tmp_path / "new" / "dir")  # created, so that a producer can write at once
    assert EngineArgs(model=tiny_model_dir, **TINY).create_engine_config().kv_transfer_config is None


def test_serve_flag_takes_the_config_as_json(tiny_model_dir, tmp_path):
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_engine_args(parser, AsyncEngineArgs)
    text = msgspec.json.encode(kv_config(tmp_path, "kv_producer")).decode()
    args = engine_args_from(parser.parse_args(["--model", tiny_model_dir, "--kv-transfer-config", text]))
    assert args.kv_transfer_config == kv_config(tmp_path, "kv_producer")
    assert args.create_engine_config().kv_transfer_config.is_kv_producer
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        parser.parse_args(["--kv-transfer-config", "SharedStorageConnector"])


# ---------------------------------------------------------------- the store, entry by entry
LAYOUT = EntryLayout(model_id="m", dtype="float32", block_size=4, num_layers=2, num_kv_heads=1, head_dim=8)


def payload(i: int) -> memoryview:
    return memoryview(bytes([i % 251]) * LAYOUT.payload_size)


def digest(i: int) -> bytes:
    return hash_block(b"", [i] * 4)


def test_an_entry_round_trips_through_a_temporary_file_and_a_rename(tmp_path):
    store = BlockStore(str(tmp_path), LAYOUT, max_bytes=1 << 20)
    assert store.load(digest(1)) is None and not store.contains(digest(1))
    store.save(digest(1), payload(1))
    assert bytes(store.load(digest(1))) == bytes(payload(1))
    assert os.listdir(tmp_path) == [os.path.basename(store.entry_path(digest(1)))]  # no temporary file left
    assert os.path.getsize(store.entry_path(digest(1))) == HEADER_SIZE + LAYOUT.payload_size
    assert store.load(digest(2)) is None


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


@pytest.mark.parametrize("change", [dict(model_id="other"), dict(dtype="bfloat16", head_dim=16),
                                    dict(block_size=8, num_layers=1), dict(num_kv_heads=2, head_dim=4)])
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
    store.save(digest(4), payload(4))  # 5 entries > 4.5: evict down to 90% of the bound
    left = {i for i in range(5) if store.contains(digest(i))}
    assert left == {0, 2, 3, 4}  # 4 entries: within 90% of the bound
    assert (tmp_path / "notes.txt").exists() and not (tmp_path / ".tmp-dead.kv").exists()
    assert all(bytes(store.load(digest(i))) == bytes(payload(i)) for i in left)


# ---------------------------------------------------------------- two engines, one directory
def test_a_consumer_loads_every_full_prompt_block_and_gives_the_producers_outputs(tiny_model_dir, produced,
                                                                                  store_copy):
    path, cold = produced
    assert [o.num_cached_tokens for o in cold] == [0, 0, 0]
    assert all(len(o.prompt_token_ids) > 350 for o in cold)
    assert all(all(len(f) == 1 for f in entry_files(path, o)) for o in cold)  # every full prompt block saved
    warm = run(tiny_model_dir, store_copy, "kv_consumer")
    assert [o.num_cached_tokens for o in warm] == [full_blocks(o) for o in cold]
    assert_same_outputs(warm, cold)
    assert sorted(os.listdir(store_copy)) == sorted(os.listdir(path))  # a consumer writes nothing


def test_a_corrupted_entry_ends_the_loaded_run_and_the_rest_is_computed(tiny_model_dir, produced, store_copy):
    _, cold = produced
    for k, out in enumerate(cold):  # prompt k: damage block 3 (k=0), block 0 (k=1), the last block (k=2)
        files = entry_files(store_copy, out)
        victim = {0: 3, 1: 0, 2: full_blocks(out) // BLOCK - 1}[k]
        with open(files[victim][0], "r+b") as f:
            f.seek(HEADER_SIZE + 100)
            byte = f.read(1)
            f.seek(HEADER_SIZE + 100)
            f.write(bytes([byte[0] ^ 0x40]))
    warm = run(tiny_model_dir, store_copy, "kv_consumer")
    assert [o.num_cached_tokens for o in warm] == [3 * BLOCK, 0, full_blocks(cold[2]) - BLOCK]
    assert_same_outputs(warm, cold)


def test_entries_of_another_model_or_block_size_are_ignored(tiny_model_dir, produced, store_copy):
    other_seed = run(tiny_model_dir, store_copy, "kv_consumer", seed=1)  # other dummy weights
    assert [o.num_cached_tokens for o in other_seed] == [0, 0, 0]
    bigger_blocks = run(tiny_model_dir, store_copy, "kv_consumer", block_size=32)
    assert [o.num_cached_tokens for o in bigger_blocks] == [0, 0, 0]


def test_a_producer_keeps_the_directory_within_its_size_bound(tiny_model_dir, tmp_path):
    entry = HEADER_SIZE + 2 * BLOCK * 2 * 2 * 16 * 4  # tiny model: 2 layers, 2 KV heads of 16, float32
    outs = run(tiny_model_dir, tmp_path, "kv_producer", extra={"max_bytes": 10 * entry})
    assert sum(len(o.prompt_token_ids) // BLOCK for o in outs) > 50  # far more blocks than the bound
    sizes = [os.path.getsize(tmp_path / name) for name in os.listdir(tmp_path)]
    assert all(size == entry for size in sizes) and 0 < sum(sizes) <= 10 * entry
    warm = run(tiny_model_dir, tmp_path, "kv_consumer")  # what survived still loads (a run of its blocks)
    assert_same_outputs(warm, outs)


def test_kv_both_engines_share_prefixes_while_both_run(tiny_model_dir, tmp_path):
    config = kv_config(tmp_path, "kv_both")
    first = LLM(model=tiny_model_dir, kv_transfer_config=config, **TINY)
    second = LLM(model=tiny_model_dir, kv_transfer_config=config, **TINY)
    try:
        a = first.generate(PROMPTS[:2], GREEDY, use_tqdm=False)
        b = second.generate(PROMPTS[1:], GREEDY, use_tqdm=False)  # PROMPTS[1] computed by the first
        assert [o.num_cached_tokens for o in a] == [0, 0]
        assert [o.num_cached_tokens for o in b] == [full_blocks(a[1]), 0]
        assert_same_outputs(b[:1], a[1:])
        again = first.generate(PROMPTS[2:], GREEDY, use_tqdm=False)  # computed and saved by the second
        assert again[0].num_cached_tokens == full_blocks(b[1])
        assert_same_outputs(again, b[1:])
        # Prompt logprobs need every prompt position computed: nothing is loaded for them.
        scored = second.generate(PROMPTS[:1], SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)[0]
        assert scored.num_cached_tokens == 0 and len(scored.prompt_logprobs) == len(a[0].prompt_token_ids)
    finally:
        first.shutdown()
        second.shutdown()


@pytest.mark.model
def test_the_default_model_gives_the_same_greedy_tokens_from_loaded_kv(tmp_path):
    prompt = " ".join(f"Line {i}: the quick brown fox jumps over the lazy dog." for i in range(40))
    params = SamplingParams(temperature=0.0, max_tokens=24)
    outs = {}
    for role in ("kv_producer", "kv_consumer"):
        llm = LLM(kv_transfer_config=kv_config(tmp_path, role), dtype="float32", max_model_len=2048)
        try:
            outs[role] = llm.generate([prompt], params, use_tqdm=False)[0]
        finally:
            llm.shutdown()
    assert outs["kv_producer"].num_cached_tokens == 0
    assert outs["kv_consumer"].num_cached_tokens == full_blocks(outs["kv_producer"]) > 400
    assert outs["kv_consumer"].outputs[0].token_ids == outs["kv_producer"].outputs[0].token_ids


# ---------------------------------------------------------------- the scheduler's side, no model
SMALL = EntryLayout(model_id="m", dtype="float32", block_size=4, num_layers=2, num_kv_heads=1, head_dim=4)


def connector(path, role: str):
    from engine.kv_transfer.shared_storage import SharedStorageConnector

    return SharedStorageConnector(KVTransferConfig(**kv_config(path, role)), SMALL)


def scheduler_with(conn, num_blocks: int = 64, budget: int = 64, caching: bool = True):
    from engine.config import SchedulerConfig
    from engine.core.kv_cache import KVCacheManager
    from engine.core.scheduler import Scheduler

    config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=budget, enable_chunked_prefill=True, policy="fcfs")
    return Scheduler(config, KVCacheManager(num_blocks, 4, caching), 256, kv_connector=conn)


def emulated_step(scheduler, kv):
    """The runner's part of a step without a model: load, write each computed token's KV as
    (its token id, its position) into every layer, save, sample token 7. Returns the step's
    SchedulerOutput and its block tables (a finished request's blocks are freed after)."""
    from core_utils import fake_runner_output

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
    import torch

    return torch.tensor([float(t * 1000 + p) for p, t in enumerate(req.all_token_ids[:num_tokens])])


def test_a_producer_saves_each_prompt_block_once_as_chunks_complete_it(tmp_path):
    import torch

    from core_utils import make_request

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
    assert len(os.listdir(tmp_path)) == 4

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
    import torch

    from core_utils import make_request
    from engine.core.request import RequestStatus

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
