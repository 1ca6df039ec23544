"""KV events stay on the host and with this user unless asked, and carry no prompt tokens by default.

The events tell what users' prompts put in the cache (BlockStored's ``token_ids`` are the prompts'
tokens), so by default the EngineCore publishes on an ipc socket in a private directory, never on
a network address, sends ``token_ids`` empty, and refuses an endpoint other hosts could reach
unless ``allow_remote`` (engine/kv_events_config.py). The replay socket answers anyone who can
reach it, so a malformed request costs a counter, not a log line (engine/core/kv_events.py).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import stat
import time

import msgspec
import pytest
import zmq

from engine import LLM, SamplingParams
from tests.helpers.process_utils import live_children
from tests.integration.test_kv_events import BlockStored, KVEventBatch

BLOCK = 16
NOBODY = 65534
END_SEQ = (-1).to_bytes(8, "big", signed=True)  # a replay's last message (vLLM's)


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[len("socket:[") : -1]))
    return inodes


def _tcp_listening(pid: int, inodes: set[int]) -> list[str]:
    """The addresses ``pid``'s sockets listen on (/proc/net/tcp and tcp6: state 0A is LISTEN)."""
    out = []
    for name in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{name}") as f:
            for line in f.read().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[9]) in inodes:
                    hex_ip = fields[1].split(":")[0]
                    raw = bytes.fromhex(hex_ip)  # the kernel's words, each in host (little-endian) order
                    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                    out.append(str(ipaddress.ip_address(words)))
    return out


def _unix_paths(pid: int, inodes: set[int]) -> list[str]:
    with open(f"/proc/{pid}/net/unix") as f:
        rows = [line.split() for line in f.read().splitlines()[1:]]
    return [row[7] for row in rows if len(row) > 7 and int(row[6]) in inodes]


def _connects_as_nobody(path: str) -> str:
    """What an unprivileged user gets connecting to the unix socket ``path``: a forked child drops
    to uid/gid 65534 and tries (no exec, so no interpreter path the other user must be able to read)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only system calls until _exit
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            s = socket.socket(socket.AF_UNIX)
            try:
                s.connect(path)
                out = b"connected"
            except OSError as e:
                out = type(e).__name__.encode()
            os.write(w, out)
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read().decode()
    os.waitpid(pid, 0)
    return out


@pytest.mark.skipif(os.geteuid() != 0, reason="connecting as another user needs root")
def test_by_default_nothing_listens_on_the_network_and_only_this_user_can_subscribe(tiny_model_dir):
    children = set(live_children())
    llm = LLM(
        model=tiny_model_dir,
        load_format="dummy",
        device="cpu",
        dtype="float32",
        kv_cache_memory=12 * (8 << 10),
        max_model_len=128,
        block_size=BLOCK,
        kv_events_config={"enable_kv_cache_events": True},
    )
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt_string(zmq.SUBSCRIBE, "")
    try:
        [core] = set(live_children()) - children
        inodes = _socket_inodes(core)
        # 1) no tcp socket of the core listens anywhere but on loopback (vLLM's default: tcp://*:5557)
        assert [a for a in _tcp_listening(core, inodes) if not ipaddress.ip_address(a).is_loopback] == []
        # 2) the events' socket: a file in a directory of this user's only
        [path] = [p for p in _unix_paths(core, inodes) if p.endswith("/kv-events")]
        directory = os.path.dirname(path)
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700 and os.stat(directory).st_uid == os.getuid()
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert _connects_as_nobody(path) == "PermissionError"
        # 3) this user subscribes; BlockStored names the blocks by hash, without their tokens or salt
        sub.connect(f"ipc://{path}")
        decoder, stores = msgspec.msgpack.Decoder(KVEventBatch), []
        greedy = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
        deadline = time.monotonic() + 30
        for i in range(50):  # PUB/SUB drops what is sent before the subscription arrives
            assert time.monotonic() < deadline
            llm.generate(
                {"prompt_token_ids": [1000 + i] * (2 * BLOCK) + [1], "cache_salt": "tenant-secret"},
                greedy,
                use_tqdm=False,
            )
            while sub.poll(200):
                _, _, payload = sub.recv_multipart()
                stores += [e for e in decoder.decode(payload).events if isinstance(e, BlockStored)]
            if stores:
                break
        assert stores and all(e.block_hashes and e.token_ids == [] and e.extra_keys is None for e in stores)
    finally:
        sub.close()
        ctx.term()
        llm.shutdown()
    assert not os.path.exists(directory)  # removed at shutdown


@pytest.mark.parametrize(
    "config, field",
    [
        ({"endpoint": "tcp://*:5557"}, "endpoint"),
        ({"endpoint": "tcp://0.0.0.0:5557"}, "endpoint"),
        ({"endpoint": "tcp://[::]:5557"}, "endpoint"),
        ({"endpoint": "tcp://eth0:5557"}, "endpoint"),
        ({"endpoint": "tcp://10.1.2.3:5557"}, "endpoint"),  # connects there
        ({"endpoint": "tcp://127.0.0.1:5557", "replay_endpoint": "tcp://*:5558"}, "replay_endpoint"),
    ],
)
def test_an_endpoint_other_hosts_can_reach_needs_allow_remote(config, field):
    from engine.config import EngineArgs
    from engine.kv_events_config import resolve_kv_events_config

    config = {"enable_kv_cache_events": True, **config}
    with pytest.raises(ValueError, match=rf"kv_events_config\.{field} .*allow_remote"):
        EngineArgs(kv_events_config=config).create_engine_config()
    assert resolve_kv_events_config({**config, "allow_remote": True}).allow_remote


@pytest.mark.parametrize(
    "endpoint",
    ["tcp://127.0.0.1:5557", "tcp://[::1]:5557", "tcp://localhost:5557", "ipc:///run/kv", "ipc://@kv", "inproc://kv"],
)
def test_loopback_ipc_and_inproc_endpoints_need_no_flag(endpoint):
    from engine.kv_events_config import resolve_kv_events_config

    assert (
        resolve_kv_events_config(
            {"enable_kv_cache_events": True, "endpoint": endpoint, "replay_endpoint": endpoint}
        ).endpoint
        == endpoint
    )


def test_a_remote_endpoint_allowed_is_opened_with_a_warning(caplog):
    from engine.core.kv_events import ZmqEventPublisher
    from engine.kv_events_config import resolve_kv_events_config

    config = resolve_kv_events_config({"enable_kv_cache_events": True, "endpoint": "tcp://*:*", "allow_remote": True})
    with caplog.at_level(logging.INFO, logger="engine.core.kv_events"):
        publisher = ZmqEventPublisher(config)
    publisher.shutdown()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert publisher.endpoint.startswith("tcp://0.0.0.0:")  # the port zmq picked, logged
    assert len(warnings) == 1 and publisher.endpoint in warnings[0] and "other hosts" in warnings[0]


def test_an_ipc_socket_file_it_binds_is_this_users_only(tmp_path):
    from engine.core.kv_events import ZmqEventPublisher
    from engine.kv_events_config import resolve_kv_events_config

    config = resolve_kv_events_config(
        {
            "enable_kv_cache_events": True,
            "endpoint": f"ipc://{tmp_path}/pub",
            "replay_endpoint": f"ipc://{tmp_path}/replay",
        }
    )
    publisher = ZmqEventPublisher(config)
    try:
        assert [stat.S_IMODE(os.stat(tmp_path / n).st_mode) for n in ("pub", "replay")] == [0o600, 0o600]
    finally:
        publisher.shutdown()


def _replay(client, start: int) -> list[bytes]:
    """The sequence numbers of one replay's answer, END_SEQ last."""
    client.send_multipart((b"", start.to_bytes(8, "big")))
    seqs = []
    while not seqs or seqs[-1] != END_SEQ:
        assert client.poll(30_000), f"no (complete) answer to a valid replay request: {seqs}"
        empty, seq, _ = client.recv_multipart()
        assert empty == b""
        seqs.append(seq)
    return seqs


def test_a_flood_of_malformed_replay_requests_costs_one_log_line_and_a_valid_one_is_still_answered(tmp_path, caplog):
    from engine.core import kv_events
    from engine.kv_events_config import resolve_kv_events_config

    config = resolve_kv_events_config(
        {
            "enable_kv_cache_events": True,
            "endpoint": f"ipc://{tmp_path}/pub",
            "replay_endpoint": f"ipc://{tmp_path}/replay",
        }
    )
    publisher = kv_events.ZmqEventPublisher(config)
    ctx = zmq.Context()
    client, hog = ctx.socket(zmq.DEALER), ctx.socket(zmq.DEALER)
    for sock in (client, hog):
        sock.setsockopt(zmq.LINGER, 0)
    # each is answered by nothing: one frame, a sequence number of 7 or 9 bytes, no empty delimiter, 4 frames
    malformed = [(b"x",), (b"", b"\xff" * 7), (b"", b"\xff" * 9), (b"junk", b"\xff" * 8), (b"", b"", b"\xff" * 8)]
    batches = [(0).to_bytes(8, "big"), (1).to_bytes(8, "big")]
    try:
        for i in range(2):
            publisher.publish(kv_events.KVEventBatch(float(i), [kv_events.AllBlocksCleared()]))
        client.connect(f"ipc://{tmp_path}/replay")
        deadline = time.monotonic() + 30
        while _replay(client, 0) != batches + [END_SEQ]:  # batches reach the buffer once sent
            assert time.monotonic() < deadline
        with caplog.at_level(logging.DEBUG, logger="engine.core.kv_events"):
            caplog.clear()
            for _ in range(100):
                for frames in malformed:
                    client.send_multipart(frames)
            # one peer's requests are served in order: this answer comes after the flood was read
            assert _replay(client, 0) == batches + [END_SEQ]
        records = [r for r in caplog.records if r.name == "engine.core.kv_events"]
        assert len(records) == 1 and "malformed replay request" in records[0].getMessage()
        assert publisher.malformed_replays == 500

        # a frame past the replay socket's size limit is refused by zmq (the peer dropped), never read whole
        hog.connect(f"ipc://{tmp_path}/replay")
        hog.send_multipart((b"", b"\0" * (64 << 20)))
        while True:  # the hog reconnects and asks properly: by then its big frame is behind it
            assert time.monotonic() < deadline + 30
            hog.send_multipart((b"", (5).to_bytes(8, "big")))
            if hog.poll(1000):
                assert hog.recv_multipart() == [b"", END_SEQ, b""]
                break
        assert publisher.malformed_replays == 500
    finally:
        client.close()
        hog.close()
        ctx.term()
        publisher.shutdown()


@pytest.mark.parametrize("contents", [False, True])
def test_block_stored_carries_tokens_and_cache_salt_only_when_asked(contents):
    from engine.core import kv_events
    from engine.core.kv_cache import KVCacheManager
    from tests.helpers.core_utils import make_request

    kv = KVCacheManager(8, 4, enable_kv_cache_events=True, event_contents=contents)
    req = make_request("a", list(range(10, 19)))
    req.cache_salt = "tenant-secret"
    hits, _ = kv.get_computed_blocks(req)
    assert kv.allocate_slots(req, req.num_tokens, hits)
    req.num_computed_tokens = req.num_tokens
    kv.cache_blocks(req)
    [event] = kv.take_events()
    assert isinstance(event, kv_events.BlockStored) and len(event.block_hashes) == 2
    assert (event.token_ids, event.extra_keys) == (
        (list(range(10, 18)), [("tenant-secret",), None]) if contents else ([], None)
    )
