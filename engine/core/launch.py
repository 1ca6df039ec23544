"""The launch contract between the frontend and an EngineCore process, imported by both sides.

The frontend (``engine.client.core_launcher``) starts ``python -m engine.core TOKEN SPEC``
(``command_line``); the core (``engine.core.engine_core_proc``) reads it back (``read_command_line``).
``SPEC`` is a JSON ``CoreLaunchSpec``; both ends build their channel and codec here, so the two
cannot disagree on the transport or the message kinds. Nothing here imports torch.

The config travels whole: the frontend derives the ``EngineConfig`` once (``create_engine_config``)
and sends its canonical encoding with its digest (engine/config/wire.py); the core decodes it,
derives nothing, and refuses to start unless its own encoding of what it decoded has the same
digest (``receive_config``). READY closes the launch by stating that digest, and the frontend
refuses a core that states another (``check_ready``): a core started for another config, or one
this frontend only attached to, cannot serve it by mistake.
"""

from __future__ import annotations

import dataclasses

import sys
from typing import TYPE_CHECKING, Optional

import msgspec

from engine.config.wire import config_digest, decode_config
from engine.exceptions import EngineStartupError
from engine.wire_messages import MESSAGE_TYPES

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from engine.wire_messages import EngineReady


class CoreLaunchSpec(msgspec.Struct):
    transport: str  # "shm" | "zmq"
    engine_index: int
    num_threads: int
    parent_pid: int
    # SIGKILL on parent death; only when launched from the main thread, because the
    # signal follows the launching *thread*, which may end long before the frontend.
    pdeathsig: bool
    config: str  # the EngineConfig's canonical JSON (engine/config/wire.py): the core derives nothing
    config_digest: str  # its digest, checked by the core (receive_config) and stated in READY
    # The frontend's import path, appended to the core's own, so a worker_cls the frontend
    # imports by name imports in the core too (as multiprocessing's spawn passes sys.path).
    sys_path: list[str] = []
    # A worker_cls given as a class: its cloudpickle, base64 (the config names the class).
    # It travels only here, at launch; the request rings carry no pickle.
    worker_cls_pickle: Optional[str] = None
    # --api-server-count N: the fd of a Unix socket over which the launcher hands over one channel
    # end per API-server process (engine/core/frontends.py); None: this channel is the only one.
    frontends_fd: Optional[int] = None


def command_line(token: str, spec: CoreLaunchSpec) -> list[str]:
    """The core's command line: its channel's peer token and the spec."""
    return [sys.executable, "-m", "engine.core", token, msgspec.json.encode(spec).decode()]


def read_command_line(argv: list[str]) -> tuple[str, CoreLaunchSpec]:
    """``command_line``'s arguments (``sys.argv[1:]`` in the core) back as the token and the spec."""
    return argv[0], msgspec.json.decode(argv[1], type=CoreLaunchSpec)


def make_codec():
    from shm_transport import MsgspecCodec

    return MsgspecCodec(MESSAGE_TYPES)


def channel_class(transport: str):
    if transport == "zmq":
        from shm_transport.zmq_channel import ZmqChannel

        return ZmqChannel
    from shm_transport import Channel

    return Channel


def receive_config(spec: CoreLaunchSpec, worker_cls: Optional[type] = None) -> EngineConfig:
    """The spec's config, decoded; ValueError unless it encodes back to the digest the frontend
    sent (this core's code would run another config than the frontend derived). The digest is
    taken before ``worker_cls`` (the class that travelled beside the config) replaces its name:
    a class carried by value need not keep its module and qualified name."""
    config = decode_config(spec.config)
    ours = config_digest(config)
    if ours != spec.config_digest:
        raise ValueError(
            f"this EngineCore reads the frontend's config as another one (digest {ours[:12]}, "
            f"frontend {spec.config_digest[:12]}): are both running the same ringllm?"
        )
    return config if worker_cls is None else dataclasses.replace(config, worker_cls=worker_cls)


def check_ready(ready: EngineReady, digest: str, core_name: str) -> None:
    """EngineStartupError unless ``ready`` states the config (by its digest) this frontend derived."""
    if ready.config_digest != digest:
        raise EngineStartupError(
            f"{core_name} runs another config than this frontend "
            f"(digest {ready.config_digest[:12]}, frontend {digest[:12]})"
        )
