"""kv_transfer_config and the SharedStorageConnector end to end: the config refuses bad values and
a store directory that is not private to this user before any process starts, two engines (each
an LLM with its EngineCore process) share prompt KV through a directory with the same results,
and nothing planted or forged in the directory can stall an engine or change its output (the
store and the scheduler's side, without a model: test_kv_connector.py).

The tiny dummy-weight model echoes its input token whatever the KV holds, so equal tokens alone
would not show that the loaded KV is right: the outputs' logprobs are compared too (zeroed KV
moves them by ~0.02; loaded KV matches computed KV to ~1e-6)."""

from __future__ import annotations

import argparse
import os
import shutil
import stat
import subprocess

import msgspec
import pytest

from engine import LLM, SamplingParams
from engine.config import AsyncEngineArgs, EngineArgs, KVTransferConfig
from engine.core.kv_cache import hash_block
from engine.entrypoints.cli_args import add_engine_args, engine_args_from
from engine.kv_transfer.entry import HEADER_SIZE, EntryHeader, entry_mac
from engine.kv_transfer.store_dir import SECRET_NAME
from tests.helpers.kv_transfer_utils import NOBODY, call_within, kv_config

TINY = dict(load_format="dummy", dtype="float32", max_model_len=1024, kv_cache_memory=16 << 20, num_threads=1, seed=0)
BLOCK = 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=3)
# Long prompts with no common prefix (so that no entry is shared between them): ~370 to ~760 tokens.
PROMPTS = [
    f"Inventory {k}: " + " ".join(f"item {i} weighs {i * 7 % 13} kg and costs {i * 11 % 17} euros." for i in range(n))
    for k, n in enumerate((30, 45, 61))
]


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


def entry_files(path, output) -> list[list[str]]:
    """The store's files for each full prompt block of ``output``, in block order. Names are keyed
    with the store's secret, so the files are found by the block hash in their headers."""
    by_hash: dict[bytes, list[str]] = {}
    for name in sorted(os.listdir(path)):
        if name.endswith(".kv"):
            with open(os.path.join(path, name), "rb") as f:
                header = EntryHeader.from_buffer_copy(f.read(HEADER_SIZE))
            by_hash.setdefault(bytes(header.block_hash), []).append(os.path.join(path, name))
    ids, digest, files = output.prompt_token_ids, b"", []
    for i in range(len(ids) // BLOCK):
        digest = hash_block(digest, ids[i * BLOCK : (i + 1) * BLOCK])
        files.append(by_hash.get(digest, []))
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
@pytest.mark.parametrize(
    "config, field, cause",
    [
        ({"kv_connector": "NixlConnector", "kv_role": "kv_both"}, "kv_connector", msgspec.ValidationError),
        ({"kv_connector": "SharedStorageConnector", "kv_role": "kv_server"}, "kv_role", msgspec.ValidationError),
        ({"kv_connector": "SharedStorageConnector", "kv_role": 1}, "kv_role", msgspec.ValidationError),
        (
            {"kv_connector": "SharedStorageConnector", "kv_role": "kv_both"},
            "shared_storage_path",
            msgspec.ValidationError,
        ),
        (
            {"kv_connector": "SharedStorageConnector", "kv_role": "kv_both", "kv_connector_extra_config": []},
            "kv_connector_extra_config",
            msgspec.ValidationError,
        ),
        (kv_config("{tmp}/x", "kv_both", max_bytes="1G"), "max_bytes", msgspec.ValidationError),
        (kv_config("{tmp}/x", "kv_both", io_timeout_s=0), "io_timeout_s", msgspec.ValidationError),
        ({**kv_config("{tmp}/x", "kv_both"), "kv_ip": "127.0.0.1"}, "kv_ip", msgspec.ValidationError),
        (kv_config("{tmp}/file", "kv_producer"), "shared_storage_path", OSError),
        ("SharedStorageConnector", "kv_transfer_config", msgspec.ValidationError),
    ],
)
def test_invalid_config_is_a_value_error_naming_the_field_before_any_process_starts(
    tiny_model_dir, tmp_path, monkeypatch, config, field, cause
):
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
    obj = KVTransferConfig(
        kv_connector="SharedStorageConnector",
        kv_role="kv_consumer",
        kv_connector_extra_config={"shared_storage_path": str(tmp_path / "new" / "dir")},
    )
    old = os.umask(0)  # the modes below are chosen, not the umask's
    try:
        config = EngineArgs(model=tiny_model_dir, kv_transfer_config=obj, **TINY).create_engine_config()
    finally:
        os.umask(old)
    assert config.kv_transfer_config == obj and config.kv_transfer_config.is_kv_consumer
    # Created private, with its secret, so that a producer can write at once.
    assert stat.S_IMODE(os.stat(tmp_path / "new" / "dir").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "new" / "dir" / SECRET_NAME).st_mode) == 0o600
    assert EngineArgs(model=tiny_model_dir, **TINY).create_engine_config().kv_transfer_config is None


def make_unsafe(store, problem: str) -> str:
    """Make ``store`` (a new directory) unsafe in one way; returns the path the error must name."""
    store.mkdir(mode=0o700)
    secret = store / SECRET_NAME
    if problem.startswith("secret"):
        secret.write_bytes(os.urandom(32))
        secret.chmod(0o600)
    if problem == "dir_owned_by_another_user":  # as `nobody`: mkdir /dev/shm/kv && chmod 0755
        os.chown(store, NOBODY, NOBODY)
        store.chmod(0o755)
    elif problem == "dir_writable_by_others":
        store.chmod(0o777)
    elif problem == "dir_writable_by_group":
        store.chmod(0o770)
    elif problem == "secret_readable_by_others":
        secret.chmod(0o644)
    elif problem == "secret_owned_by_another_user":
        os.chown(secret, NOBODY, NOBODY)
    elif problem == "secret_a_symlink":
        os.rename(secret, store.parent / "elsewhere")
        os.symlink(store.parent / "elsewhere", secret)
    elif problem == "secret_a_fifo":
        secret.unlink()
        os.mkfifo(secret, 0o600)
    return str(secret if problem.startswith("secret") else store)


@pytest.mark.parametrize(
    "problem, owner",
    [
        ("dir_owned_by_another_user", "uid 65534"),
        ("dir_writable_by_others", "uid 0"),
        ("dir_writable_by_group", "uid 0"),
        ("secret_readable_by_others", "uid 0"),
        ("secret_owned_by_another_user", "uid 65534"),
        ("secret_a_symlink", None),
        ("secret_a_fifo", "uid 0"),
    ],
)
@pytest.mark.parametrize("role", ["kv_producer", "kv_consumer"])
def test_a_store_that_is_not_private_to_this_user_is_refused_naming_path_and_owner_before_any_process_starts(
    tiny_model_dir, tmp_path, monkeypatch, problem, owner, role
):
    named = make_unsafe(tmp_path / "kv", problem)
    before = sorted(os.listdir(tmp_path / "kv"))

    def no_process(*args, **kwargs):
        raise AssertionError("a process was started with an unsafe store")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    with pytest.raises(ValueError, match="shared_storage_path") as err:
        LLM(model=tiny_model_dir, kv_transfer_config=kv_config(tmp_path / "kv", role), **TINY)
    assert repr(named) in str(err.value) and (owner is None or owner in str(err.value))
    assert isinstance(err.value.__cause__, OSError)
    assert sorted(os.listdir(tmp_path / "kv")) == before  # nothing written, nothing "repaired"


def test_serve_flag_takes_the_config_as_json(tiny_model_dir, tmp_path):
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_engine_args(parser, AsyncEngineArgs)
    text = msgspec.json.encode(kv_config(tmp_path, "kv_producer")).decode()
    args = engine_args_from(parser.parse_args(["--model", tiny_model_dir, "--kv-transfer-config", text]))
    assert args.kv_transfer_config == kv_config(tmp_path, "kv_producer")
    assert args.create_engine_config().kv_transfer_config.is_kv_producer
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        parser.parse_args(["--kv-transfer-config", "SharedStorageConnector"])


# ---------------------------------------------------------------- two engines, one directory
def test_a_consumer_loads_every_full_prompt_block_and_gives_the_producers_outputs(tiny_model_dir, produced, store_copy):
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


def forge_entry(path: str, payload: bytes) -> None:
    """Rewrite the entry at ``path`` to hold ``payload``, as the format says, with a MAC under a
    guessed key: every other header field (block hash, model digest, geometry) is public."""
    with open(path, "rb") as f:
        header = EntryHeader.from_buffer_copy(f.read(HEADER_SIZE))
    header.mac[:] = entry_mac(os.urandom(32), bytes(header), memoryview(payload))
    with open(path, "wb") as f:
        f.write(bytes(header) + payload)


def test_planted_and_forged_entries_are_misses_and_the_engine_serves_correct_outputs(
    tiny_model_dir, produced, store_copy
):
    _, cold = produced  # the producer computed every token: the outputs of a run without the store
    files = [entry_files(store_copy, out) for out in cold]
    fifo = files[0][2][0]  # prompt 0: a FIFO at block 2's name (it froze the engine in open())
    os.unlink(fifo)
    os.mkfifo(fifo, 0o600)
    link = files[1][1][0]  # prompt 1: block 1's own, whole entry, reached through a symlink
    os.rename(link, store_copy.parent / "moved.kv")
    os.symlink(store_copy.parent / "moved.kv", link)
    forged = files[2][0][0]  # prompt 2: block 0 forged with zeroed KV (it moves the logprobs if used)
    forge_entry(forged, bytes(os.path.getsize(forged) - HEADER_SIZE))
    warm = call_within(240, fifo, lambda: run(tiny_model_dir, store_copy, "kv_consumer"))
    assert [o.num_cached_tokens for o in warm] == [2 * BLOCK, BLOCK, 0]
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
    sizes = [os.path.getsize(tmp_path / name) for name in os.listdir(tmp_path) if name.endswith(".kv")]
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
def test_the_default_model_gives_the_same_greedy_text_from_loaded_kv_and_ignores_a_poisoned_store(tmp_path):
    prompt = " ".join(f"Line {i}: the quick brown fox jumps over the lazy dog." for i in range(40))
    other = " ".join(f"Line {i}: a slow green turtle naps under the old oak tree." for i in range(60))
    params = SamplingParams(temperature=0.0, max_tokens=24)
    outs = {}
    for role in ("kv_producer", "kv_consumer"):
        llm = LLM(kv_transfer_config=kv_config(tmp_path, role), dtype="float32", max_model_len=2048)
        try:
            outs[role] = llm.generate([prompt, other] if role == "kv_producer" else [prompt], params, use_tqdm=False)
        finally:
            llm.shutdown()
    (cold, source), (warm,) = outs["kv_producer"], outs["kv_consumer"]
    assert cold.num_cached_tokens == 0
    assert warm.num_cached_tokens == full_blocks(cold) > 400
    assert warm.outputs[0].token_ids == cold.outputs[0].token_ids
    # Poisoned: each of the prompt's entries given the other prompt's KV of the same position under a
    # forged MAC. Accepted, it turns the answer into "...a classic "fairy tale"..." (checked once with
    # the MAC check disabled); refused, the answer is the cold one.
    theirs = [files[0] for files in entry_files(tmp_path, source)]
    for files, donor in zip(entry_files(tmp_path, cold), theirs):
        with open(donor, "rb") as f:
            forge_entry(files[0], f.read()[HEADER_SIZE:])
    llm = LLM(kv_transfer_config=kv_config(tmp_path, "kv_consumer"), dtype="float32", max_model_len=2048)
    try:
        poisoned = llm.generate([prompt], params, use_tqdm=False)[0]
    finally:
        llm.shutdown()
    assert poisoned.num_cached_tokens == 0
    assert poisoned.outputs[0].text == cold.outputs[0].text
