"""Typed messages on the wire: one kind byte, then the msgpack body (msgspec).

The kind byte is the index of the message's type in the list the codec was built with, so both
sides must build their codec from the same list, in the same order. No pickle ever crosses.
"""
from __future__ import annotations

from typing import Any, Sequence

import msgspec

_FORBIDDEN = (msgspec.Raw, memoryview)


class MsgspecCodec:
    """Encode/decode msgspec Structs with a one-byte kind prefix.

    ``encode(msg) -> bytes`` and ``decode(buf) -> msg`` give the whole frame; the channel uses
    ``kind_of``/``encode_body`` and ``decoders`` directly, so the kind byte is written by the ring
    and never concatenated in Python. Decoding always
    produces owned objects: types with ``msgspec.Raw`` or ``memoryview`` fields are refused,
    because those would keep pointing into shared memory after its space is released.
    """

    def __init__(self, types: Sequence[type]) -> None:
        types = list(types)
        if not types:
            raise ValueError("MsgspecCodec needs at least one message type")
        if len(types) > 256:
            raise ValueError(f"MsgspecCodec takes at most 256 message types (one kind byte), got {len(types)}")
        for t in types:
            if not (isinstance(t, type) and issubclass(t, msgspec.Struct)):
                raise TypeError(f"MsgspecCodec types must be msgspec.Struct subclasses, got {t!r}")
            for f in msgspec.structs.fields(t):
                if f.type in _FORBIDDEN:
                    raise TypeError(f"{t.__name__}.{f.name} is {f.type.__name__}: it would alias shared "
                                    "memory after decode; use bytes")
        if len(set(types)) != len(types):
            raise ValueError("MsgspecCodec types must be distinct")
        self.types = tuple(types)
        self.kind_of = {t: i for i, t in enumerate(types)}  # type -> kind byte
        self.encode_body = msgspec.msgpack.Encoder().encode  # msg -> msgpack body (no kind byte)
        self.decoders = tuple(msgspec.msgpack.Decoder(t) for t in types)  # kind -> decoder

    def kind_and_body(self, msg: Any) -> tuple[int, bytes]:
        """The kind byte and msgpack body of ``msg``; TypeError for a type not in the codec."""
        try:
            kind = self.kind_of[type(msg)]
        except KeyError:
            raise TypeError(f"cannot send {type(msg).__name__}: not one of this codec's types "
                            f"({', '.join(t.__name__ for t in self.types)})") from None
        return kind, self.encode_body(msg)

    def encode(self, msg: Any) -> bytes:
        kind, body = self.kind_and_body(msg)
        return bytes((kind,)) + body

    def decode_at(self, buf: Any, offset: int, length: int) -> Any:
        """Decode the frame at ``buf[offset:offset+length]`` (any buffer, e.g. mapped memory)."""
        if length < 1:
            raise msgspec.DecodeError("empty frame: no kind byte")
        kind = buf[offset]
        if kind >= len(self.decoders):
            raise msgspec.DecodeError(f"unknown message kind {kind} (codec has {len(self.decoders)} types)")
        return self.decoders[kind].decode(buf[offset + 1:offset + length])

    def decode(self, frame: Any) -> Any:
        view = memoryview(frame)
        return self.decode_at(view, 0, len(view))
