"""The launch contract between the frontend and an EngineCore process, imported by both sides.

The frontend (``engine.client.core_launcher``) starts ``python -m engine.core TOKEN SPEC``
(``command_line``); the core (``engine.core.engine_core_proc``) reads it back (``read_command_line``).
``SPEC`` is a JSON ``CoreLaunchSpec``; both ends build their channel and codec here, so the two
cannot disagree on the transport or the message kinds. Nothing here imports torch.

The READY handshake closes the launch. Both processes derive their ``EngineConfig`` with the
same function (``create_engine_config``) from the same arguments; the core does so on its own
so that it can load the model while the frontend reads the tokenizer. The two derivations can
still part (a file changed between the reads, an environment variable that only one side sees,
a bug): the frontend would then tokenize, bound and schedule for a model the core does not run.
The core reports what it derived (``ready_fields``), and the frontend refuses to start on any
difference, naming the field (``check_ready``).
"""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Optional

import msgspec

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
    engine_args: dict[str, Any]  # EngineArgs fields; the core derives its own config
    # The frontend's import path, appended to the core's own, so a worker_cls the frontend
    # imports by name imports in the core too (as multiprocessing's spawn passes sys.path).
    sys_path: list[str] = []
    # A worker_cls given as a class: its cloudpickle, base64 (engine_args holds "auto" then).
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


def ready_fields(config: EngineConfig) -> dict[str, Any]:
    """The config fields a READY carries (the core sends them, the frontend expects them)."""
    return {"block_size": config.cache_config.block_size, "max_model_len": config.model_config.max_model_len,
            "vocab_size": config.model_config.vocab_size, "dtype": config.model_config.dtype,
            "max_num_seqs": config.scheduler_config.max_num_seqs,
            "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens}


def check_ready(ready: EngineReady, config: EngineConfig, core_name: str) -> None:
    """EngineStartupError unless ``ready`` states the config this frontend derived."""
    differ = [f"{name}: core {getattr(ready, name)!r}, frontend {value!r}"
              for name, value in ready_fields(config).items() if getattr(ready, name) != value]
    if differ:
        raise EngineStartupError(f"{core_name} derived another config than this frontend ({'; '.join(differ)})")
