"""KV-cache events: a subscriber follows the prefix cache over ZMQ, in vLLM's wire format.

The subscriber is what a router runs: pyzmq SUB, and msgspec structs declared here the way
vLLM's consumers declare them (the batch a positional array, each event a map tagged "type"),
not ringllm's own classes, so the test fails if the wire drifts from vLLM's. The engine is a
real ``LLM`` with its EngineCore in its own process, on the tiny model with a 12-block cache,
so new prompts must evict the old ones' blocks.
"""

from __future__ import annotations

import time
from typing import Any, Optional, Union

import msgspec
import pytest
import zmq

from engine import LLM, SamplingParams
from engine.core.kv_cache import hash_block
from tests.helpers.openai_server_utils import free_port

BLOCK = 16
TOPIC = "kv"


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: Optional[int] = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[Union[bytes, int]]
    parent_block_hash: Union[bytes, int, None]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]
    lora_name: Optional[str]
    extra_keys: Optional[list] = None
    group_idx: Optional[int] = None
    kv_cache_spec_kind: Optional[str] = None
    kv_cache_spec_sliding_window: Optional[int] = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[Union[bytes, int]]
    medium: Optional[str]
    group_idx: Optional[int] = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[Union[BlockStored, BlockRemoved, AllBlocksCleared]]


class Subscriber:
    """A SUB socket bound before the engine starts (the engine's PUB connects to it)."""

    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt_string(zmq.SUBSCRIBE, TOPIC)
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.sock.bind(self.endpoint)
        self.decoder = msgspec.msgpack.Decoder(KVEventBatch)
        self.last_seq = -1
        self.events: list = []

    def drain(self, until, timeout: float = 30.0) -> list:
        """Receive batches until ``until(all events so far)`` holds; checks the framing."""
        deadline = time.monotonic() + timeout
        while not until(self.events):
            assert time.monotonic() < deadline, f"events so far: {self.events}"
            if self.sock.poll(100):
                topic, seq, payload = self.sock.recv_multipart()
                assert topic == TOPIC.encode() and len(seq) == 8
                n = int.from_bytes(seq, "big")
                assert n == self.last_seq + 1 or self.last_seq == -1, "a batch was lost"
                self.last_seq = n
                batch = self.decoder.decode(payload)
                assert batch.data_parallel_rank == 0 and batch.ts > 1e9  # wall-clock seconds
                self.events.extend(batch.events)
        return self.events

    def close(self) -> None:
        self.sock.close()
        self.ctx.term()


def chain(tokens: list[int]) -> list[bytes]:
    """The prefix cache's digests of the full blocks of ``tokens``."""
    hashes, parent = [], b""
    for i in range(len(tokens) // BLOCK):
        parent = hash_block(parent, tokens[i * BLOCK : (i + 1) * BLOCK])
        hashes.append(parent)
    return hashes


def stored_hashes(events) -> list[bytes]:
    return [h for e in events if isinstance(e, BlockStored) for h in e.block_hashes]


@pytest.fixture
def subscriber():
    sub = Subscriber()
    yield sub
    sub.close()


def test_a_subscriber_follows_the_cache_stored_evicted_and_cleared(tiny_model_dir, subscriber):
    llm = LLM(
        model=tiny_model_dir,
        load_format="dummy",
        device="cpu",
        dtype="float32",
        kv_cache_memory=12 * (8 << 10),
        max_model_len=128,
        block_size=BLOCK,
        kv_events_config={
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": subscriber.endpoint,
            "topic": TOPIC,
            "include_token_ids": True,
        },
    )
    greedy = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    try:
        # PUB/SUB drops what is sent before the subscription arrives: warm up until a batch lands
        warm = [[1000 + i] * BLOCK + [1] for i in range(50)]
        for prompt in warm:
            llm.generate({"prompt_token_ids": prompt}, greedy, use_tqdm=False)
            if subscriber.sock.poll(200):
                break
        subscriber.drain(lambda ev: stored_hashes(ev))
        subscriber.events.clear()

        # 1) a new prefix of three full blocks: BlockStored with the cache's own digests, chained
        prompt = [(7 * j) % 2000 + 10 for j in range(3 * BLOCK)] + [5, 6]
        expected = chain(prompt)
        llm.generate({"prompt_token_ids": prompt}, greedy, use_tqdm=False)
        events = subscriber.drain(lambda ev: set(expected) <= set(stored_hashes(ev)))
        stores = [e for e in events if isinstance(e, BlockStored) and set(e.block_hashes) & set(expected)]
        assert [h for e in stores for h in e.block_hashes] == expected
        first = stores[0]
        assert first.parent_block_hash is None and first.block_size == BLOCK and first.medium == "GPU"
        assert first.token_ids == prompt[: len(first.block_hashes) * BLOCK]
        assert all(len(h) == 16 for h in expected)  # blake2b-128 digests, sent as bytes

        # 2) the same prefix again: a hit, nothing stored
        subscriber.events.clear()
        llm.generate({"prompt_token_ids": prompt[: 2 * BLOCK] + [9, 9]}, greedy, use_tqdm=False)
        # 3) prompts that need every block: the old ones are evicted, BlockRemoved names them
        for i in range(3):
            llm.generate({"prompt_token_ids": [300 + i] * (6 * BLOCK) + [1]}, greedy, use_tqdm=False)
        events = subscriber.drain(
            lambda ev: set(expected) <= {h for e in ev if isinstance(e, BlockRemoved) for h in e.block_hashes}
        )
        assert not set(expected) & set(stored_hashes(events))  # the hit stored nothing new of it
        assert all(e.medium == "GPU" for e in events if isinstance(e, BlockRemoved))

        # 4) reset_prefix_cache: AllBlocksCleared
        assert llm.reset_prefix_cache()
        subscriber.drain(lambda ev: any(isinstance(e, AllBlocksCleared) for e in ev))
    finally:
        llm.shutdown()


def test_cache_salt_is_the_first_blocks_extra_key():
    from engine.core import kv_events

    event = msgspec.msgpack.decode(
        msgspec.msgpack.encode(kv_events.stored([b"a" * 16, b"b" * 16], None, list(range(32)), BLOCK, "tenant")),
        type=BlockStored,
    )
    assert event.extra_keys == [["tenant"], None] and event.kv_cache_spec_kind == "full_attention"


@pytest.mark.parametrize(
    "config, field",
    [
        ({"enable_kv_cache_events": True, "publisher": "kafka"}, "publisher"),
        ({"enable_kv_cache_events": True, "endpoint": "udp://x"}, "endpoint"),
        ({"enable_kv_cache_events": True, "hwm": 0}, "hwm"),
        ({"enable_kv_cache_events": True, "topics": "x"}, "topics"),
    ],
)
def test_a_bad_kv_events_config_is_refused_naming_the_field(config, field):
    from engine.config import EngineArgs

    with pytest.raises(ValueError, match=field):
        EngineArgs(kv_events_config=config).create_engine_config()


def test_replay_serves_the_missed_batches_then_the_end_marker(tmp_path):
    """A subscriber that saw a gap asks the ROUTER for every batch from a sequence number on
    (with a DEALER: a REQ socket would take the first reply only)."""
    from engine.core.kv_events import END_SEQ, ZmqEventPublisher
    from engine.kv_events_config import resolve_kv_events_config

    config = resolve_kv_events_config(
        {
            "enable_kv_cache_events": True,
            "endpoint": f"ipc://{tmp_path}/pub",
            "replay_endpoint": f"ipc://{tmp_path}/replay",
            "topic": TOPIC,
        }
    )
    publisher = ZmqEventPublisher(config)
    ctx = zmq.Context()
    req = ctx.socket(zmq.DEALER)
    req.setsockopt(zmq.LINGER, 0)
    try:
        from engine.core import kv_events

        for i in range(3):
            publisher.publish(kv_events.KVEventBatch(float(i), [kv_events.removed(bytes([i]) * 16)]))
        req.connect(f"ipc://{tmp_path}/replay")
        decoder = msgspec.msgpack.Decoder(KVEventBatch)
        replayed, deadline = [], time.monotonic() + 30
        while len(replayed) < 2:  # batches reach the buffer once sent: ask again until both are there
            assert time.monotonic() < deadline, replayed
            replayed = []
            req.send_multipart((b"", (1).to_bytes(8, "big")))
            while True:
                assert req.poll(10_000), "no replay answer"
                empty, seq, payload = req.recv_multipart()
                assert empty == b""
                if seq == END_SEQ:
                    assert payload == b""
                    break
                replayed.append((int.from_bytes(seq, "big"), decoder.decode(payload)))
        assert [(n, b.ts, b.events[0].block_hashes) for n, b in replayed] == [
            (1, 1.0, [b"\x01" * 16]),
            (2, 2.0, [b"\x02" * 16]),
        ]
    finally:
        req.close()
        ctx.term()
        publisher.shutdown()


def test_a_full_queue_drops_batches_and_counts_them_without_blocking(tmp_path):
    from engine.core import kv_events
    from engine.kv_events_config import resolve_kv_events_config

    config = resolve_kv_events_config(
        {"enable_kv_cache_events": True, "endpoint": f"ipc://{tmp_path}/pub", "max_queue_size": 1}
    )
    publisher = kv_events.ZmqEventPublisher(config)
    publisher.shutdown()  # its thread gone, nothing drains the queue any more
    for i in range(3):
        publisher.publish(kv_events.KVEventBatch(float(i), [kv_events.AllBlocksCleared()]))
    assert publisher.dropped == 2


def test_an_endpoint_zmq_cannot_open_fails_the_start_naming_kv_events_config(tiny_model_dir):
    with pytest.raises(Exception, match="kv_events_config: cannot open 'ipc:///nonexistent/kv'"):
        LLM(
            model=tiny_model_dir,
            load_format="dummy",
            device="cpu",
            kv_cache_memory=1 << 20,
            max_model_len=128,
            kv_events_config={"enable_kv_cache_events": True, "endpoint": "ipc:///nonexistent/kv"},
        )


def test_the_kv_events_config_flag_takes_vllms_json():
    import argparse

    from engine.entrypoints.cli_args import add_engine_args, engine_args_from
    from engine.kv_events_config import KVEventsConfig, resolve_kv_events_config

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = engine_args_from(
        parser.parse_args(
            [
                "--kv-events-config",
                '{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557", "topic": "kv", "allow_remote": true}',
            ]
        )
    )
    assert resolve_kv_events_config(args.kv_events_config) == KVEventsConfig(
        enable_kv_cache_events=True, publisher="zmq", endpoint="tcp://*:5557", topic="kv", allow_remote=True
    )
    # enabled=false, or the null publisher: nothing is published
    assert resolve_kv_events_config({"enable_kv_cache_events": False}) is None
    assert resolve_kv_events_config({"enable_kv_cache_events": True, "publisher": "null"}) is None


def test_each_data_parallel_rank_publishes_on_its_own_address():
    from engine.core.kv_events import offset_endpoint

    assert offset_endpoint("tcp://*:5557", 0) == "tcp://*:5557"
    assert offset_endpoint("tcp://*:5557", 2) == "tcp://*:5559"
    assert offset_endpoint("ipc:///tmp/kv", 1) == "ipc:///tmp/kv_dp1"
