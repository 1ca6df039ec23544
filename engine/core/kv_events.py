"""KV-cache events in vLLM's wire format, and the EngineCore's ZMQ publisher of them.

Routers that place requests by cache contents (llm-d's KV indexer, NVIDIA Dynamo's KV router,
vllm-router) follow an engine's prefix cache from these events rather than from metrics:
``BlockStored`` when full blocks enter the cache, ``BlockRemoved`` when evicted blocks leave it,
``AllBlocksCleared`` on ``reset_prefix_cache``. The block hashes are the prefix cache's own
digests (engine/core/kv_cache.py: 16-byte blake2b, each chained to its parent block's), sent as
msgpack bytes, which vLLM's ``ExternalBlockHash`` (``bytes | int``) admits.

The wire is vLLM's (vllm/distributed/kv_events.py; events as tagged maps since vLLM PR 42892):
a multipart message ``[topic, seq as 8 bytes big-endian, payload]`` whose payload is a msgpack
``KVEventBatch`` array ``[ts, events, data_parallel_rank]`` (``ts`` wall-clock seconds) and each
event a map with its class name under ``"type"`` and vLLM's field names in vLLM's order.

The KV cache manager collects a step's events; the core hands them over once per step as one
batch. Encoding and sending happen on the publisher's own thread, behind a bounded queue: a
slow or absent subscriber never stalls a step. When the queue is full a batch is dropped and
counted (``dropped``, logged), as a PUB socket drops for a slow subscriber anyway; sequence
numbers are given at send, so a gap a subscriber sees is a loss at the socket, which the
replay socket (``replay_endpoint``) can fill from the last ``buffer_steps`` batches.

Where the sockets are, and what the events carry, is engine/kv_events_config.py's concern: by
default a private ipc socket and no token ids. The replay socket answers whoever reaches it: a
malformed request is counted and dropped unanswered, with at most one warning a minute.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import weakref
from collections import deque
from itertools import count
from typing import Any, Optional, TypeVar, Union

import msgspec

from engine.kv_events_config import KVEventsConfig, is_remote
from shm_transport import ipc_dir

logger = logging.getLogger(__name__)

MEDIUM_GPU = "GPU"  # vLLM's name for the engine's own KV cache (its device memory), whatever the device
FULL_ATTENTION = "full_attention"
END_SEQ = (-1).to_bytes(8, "big", signed=True)  # a replay's last message
_Endpoint = TypeVar("_Endpoint", str, Optional[str])  # an endpoint given stays given


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: Optional[int] = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of the events: tagged with the class name under "type"."""


class BlockStored(KVCacheEvent):
    block_hashes: list[bytes]
    parent_block_hash: Optional[bytes]
    token_ids: list[int]  # empty (and extra_keys None) unless kv_events_config.include_token_ids
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]
    lora_name: Optional[str]
    # one entry per block: what besides its tokens entered its hash (here: a cache_salt, first block only)
    extra_keys: Optional[list[Optional[tuple[Any, ...]]]] = None
    group_idx: Optional[int] = None
    kv_cache_spec_kind: Optional[str] = None
    kv_cache_spec_sliding_window: Optional[int] = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[bytes]
    medium: Optional[str]
    group_idx: Optional[int] = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[Union[BlockStored, BlockRemoved, AllBlocksCleared]]


def stored(
    block_hashes: list[bytes],
    parent: Optional[bytes],
    token_ids: list[int],
    block_size: int,
    cache_salt: Optional[str],
    lora: Optional[Any] = None,
) -> BlockStored:
    """``lora``: the request's LoRARequest (its id and name go into vLLM's lora_id and lora_name)."""
    extra = None
    if cache_salt is not None and parent is None:  # the salt is the first block's parent digest
        extra = [(cache_salt,)] + [None] * (len(block_hashes) - 1)
    lora_id, lora_name = (lora.lora_int_id, lora.lora_name) if lora is not None else (None, None)
    return BlockStored(
        block_hashes, parent, token_ids, block_size, lora_id, MEDIUM_GPU, lora_name, extra, 0, FULL_ATTENTION
    )


def removed(block_hash: bytes) -> BlockRemoved:
    return BlockRemoved([block_hash], MEDIUM_GPU, 0)


def offset_endpoint(endpoint: _Endpoint, rank: int) -> _Endpoint:
    """Each data-parallel rank publishes on its own address (vLLM's rule): a tcp port plus the
    rank, an ipc/inproc path with ``_dp<rank>`` appended."""
    if not endpoint or rank == 0:
        return endpoint
    if endpoint.startswith("tcp://"):
        base, _, port = endpoint.rpartition(":")
        return f"{base}:{int(port) + rank}"
    return f"{endpoint}_dp{rank}"


def _binds(endpoint: str) -> bool:
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class RareWarning:
    """A warning that others can trigger at will (a malformed request, a full queue): counted
    every time, logged at most once per ``interval`` seconds with the count so far, so a flood
    costs a counter rather than the log."""

    def __init__(self, message: str, interval: float = 60.0) -> None:
        self.message = message  # %d: the count so far
        self.interval = interval
        self.count = 0
        self._next = 0.0  # monotonic time from which the next warning may be logged

    def __call__(self) -> None:
        self.count += 1
        now = time.monotonic()
        if now >= self._next:
            self._next = now + self.interval
            logger.warning(self.message, self.count)


class ZmqEventPublisher:
    """PUB socket (bound or connected per vLLM's rule), optional ROUTER for replays, one thread.

    ``endpoint``/``replay_endpoint``: the addresses actually opened (the default's private ipc
    path, a tcp port zmq picked), logged at start so that a subscriber can find them."""

    _POLL_S = 0.1
    _REPLAYS_PER_TURN = 64  # replay requests served between two batches: a flood delays, never starves, them
    _REPLAY_FRAME_MAX = 64  # bytes of a replay request's frame (its sequence number is 8)

    def __init__(self, config: KVEventsConfig, data_parallel_rank: int = 0) -> None:
        import zmq

        self._rank = data_parallel_rank
        self._topic = config.topic.encode()
        self._queue: queue.Queue = queue.Queue(maxsize=config.max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._dropped = RareWarning("KV events: %d batch(es) dropped so far, the publisher queue is full")
        self._malformed = RareWarning(
            "KV events: %d malformed replay request(s) ignored so far (not [identity, empty, 8-byte sequence number])"
        )
        self._remove_dir = None  # the default endpoint's private directory: removed at close
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._replay = None
        endpoint, self.replay_endpoint = config.endpoint, None
        try:
            if endpoint is None:
                directory = ipc_dir.make()
                self._remove_dir = weakref.finalize(self, ipc_dir.remove, directory)  # at exit at the latest
                endpoint = f"ipc://{directory}/kv-events"
            self._pub.set_hwm(config.hwm)
            self._pub.setsockopt(zmq.LINGER, 0)
            endpoint = offset_endpoint(endpoint, data_parallel_rank)
            self.endpoint = self._open(self._pub, endpoint, bind=_binds(endpoint))
            if config.replay_endpoint is not None:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                self._replay.setsockopt(zmq.MAXMSGSIZE, self._REPLAY_FRAME_MAX)  # larger: the peer is dropped
                self.replay_endpoint = self._open(
                    self._replay, offset_endpoint(config.replay_endpoint, data_parallel_rank), bind=True
                )
        except (zmq.ZMQError, OSError) as e:
            self._close()
            raise ValueError(
                f"kv_events_config: cannot open {endpoint!r} (or replay_endpoint {config.replay_endpoint!r}): {e}"
            ) from None
        for name, opened in (("endpoint", self.endpoint), ("replay_endpoint", self.replay_endpoint)):
            if opened is not None and is_remote(opened):
                logger.warning(
                    "KV events: %s %s can be reached from other hosts (allow_remote): anyone who "
                    "connects sees the cache's block hashes%s",
                    name,
                    opened,
                    " and the prompts' token ids" if config.include_token_ids else "",
                )
        logger.info(
            "KV events of engine %d: published on %s%s",
            data_parallel_rank,
            self.endpoint,
            f", replays on {self.replay_endpoint}" if self.replay_endpoint else "",
        )
        self._thread = threading.Thread(target=self._run, name="kv-events-publisher", daemon=True)
        self._thread.start()

    @staticmethod
    def _open(sock: Any, endpoint: str, bind: bool) -> str:
        """Bind or connect ``sock``; an ipc socket file it binds is made this user's only (0600).
        Returns the address opened (a bound tcp port zmq picked included)."""
        import zmq

        if not bind:
            sock.connect(endpoint)
            return endpoint
        sock.bind(endpoint)
        opened = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        if opened.startswith("ipc://") and not opened.startswith("ipc://@"):  # not the abstract namespace
            os.chmod(opened[len("ipc://") :], 0o600)
        return opened

    @property
    def dropped(self) -> int:
        return self._dropped.count

    @property
    def malformed_replays(self) -> int:
        return self._malformed.count

    def publish(self, batch: EventBatch) -> None:
        """Hand a step's batch to the thread; never blocks (a full queue drops it, counted)."""
        if batch.data_parallel_rank is None:
            batch.data_parallel_rank = self._rank
        try:
            self._queue.put_nowait(batch)
        except queue.Full:
            self._dropped()

    def shutdown(self, timeout: float = 1.0) -> None:
        """Send what is queued (for up to ``timeout`` s), then close the sockets."""
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            pass
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._close()
        elif self._remove_dir is not None:  # its sockets stay with the thread, their directory goes
            self._remove_dir()

    def _close(self) -> None:
        for sock in (self._pub, self._replay):
            if sock is not None:
                sock.close(linger=0)
        self._ctx.term()
        if self._remove_dir is not None:
            self._remove_dir()

    def _run(self) -> None:
        encode = msgspec.msgpack.Encoder().encode
        seq = count()
        while True:
            for _ in range(self._REPLAYS_PER_TURN):
                if self._replay is None or not self._replay.poll(0):
                    break
                self._serve_replay()
            try:
                batch = self._queue.get(timeout=self._POLL_S)
            except queue.Empty:
                continue
            if batch is None:
                return
            try:
                n, payload = next(seq), encode(batch)
                self._pub.send_multipart((self._topic, n.to_bytes(8, "big"), payload))
                self._buffer.append((n, payload))
            except Exception:  # a bad batch or a closed socket: log, keep the step loop unaffected
                logger.exception("KV events: publishing a batch failed")

    def _serve_replay(self) -> None:
        """A subscriber sent [identity, b"", start seq as 8 bytes]: every kept batch from there,
        then END_SEQ. Anything else is counted and dropped unanswered (``RareWarning``)."""
        replay = self._replay
        assert replay is not None  # polled only when a replay endpoint is open
        frames = replay.recv_multipart()
        if len(frames) != 3 or frames[1] != b"" or len(frames[2]) != 8:
            self._malformed()
            return
        client, _, start = frames
        first = int.from_bytes(start, "big")
        for n, payload in list(self._buffer):
            if n >= first:
                replay.send_multipart((client, b"", n.to_bytes(8, "big"), payload))
        replay.send_multipart((client, b"", END_SEQ, b""))


def make_publisher(config: Optional[KVEventsConfig], data_parallel_rank: int) -> Optional[ZmqEventPublisher]:
    return ZmqEventPublisher(config, data_parallel_rank) if config is not None and config.active else None
