"""The launch contract between the frontend and an EngineCore process, imported by both sides.

The frontend (``engine.client.core_launcher``) writes a JSON ``CoreLaunchSpec`` into a memfd
(``write_spec``) and starts ``python -m engine.core FD`` (``command_line``) with that fd inherited;
the core (``engine.core.engine_core_proc``) reads the spec from it (``read_spec``). Not on the
command line: Linux caps one argument at 128 KiB and argv with the environment at ~2 MiB, which a
config with large fields (hf_overrides, say) passes (the launch failed with E2BIG), and ``ps``
shows every user the command line, so neither the config nor the channel's token belongs there.
A memfd rather than a pipe: the frontend writes the whole spec before the core starts, whatever
its size, and never waits for the core to read it. Both ends build their channel and codec here,
so the two cannot disagree on the transport or the message kinds. Nothing here imports torch.

The config travels whole: the frontend derives the ``EngineConfig`` once (``create_engine_config``)
and sends its canonical encoding with its digest (engine/config/wire.py); the core decodes it,
derives nothing, and refuses to start unless its own encoding of what it decoded has the same
digest (``receive_config``). READY closes the launch by stating that digest, and the frontend
refuses a core that states another (``check_ready``): a core started for another config, or one
this frontend only attached to, cannot serve it by mistake.
"""

from __future__ import annotations

import dataclasses
import os
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
    token: str  # the frontend's channel end's peer token (the core attaches with it)
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


def write_spec(spec: CoreLaunchSpec) -> int:
    """A close-on-exec memfd holding ``spec``, read from its start: the caller passes it to the
    core (``pass_fds``, ``command_line``) and closes its own copy once the core is started."""
    fd = os.memfd_create("ringllm-launch-spec", os.MFD_CLOEXEC)
    try:
        data = memoryview(msgspec.json.encode(spec))
        while data:
            data = data[os.write(fd, data) :]
        os.lseek(fd, 0, os.SEEK_SET)
        return fd
    except BaseException:
        os.close(fd)
        raise


def command_line(spec_fd: int) -> list[str]:
    """The core's command line: the number of the inherited fd that holds its spec, nothing else."""
    return [sys.executable, "-m", "engine.core", str(spec_fd)]


def read_spec(argv: list[str]) -> CoreLaunchSpec:
    """The spec ``command_line``'s argument (``sys.argv[1:]`` in the core) names, read to its end;
    the fd is closed."""
    with open(int(argv[0]), "rb") as f:
        return msgspec.json.decode(f.read(), type=CoreLaunchSpec)


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
