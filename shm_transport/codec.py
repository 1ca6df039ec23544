"""Typed messages on the wire: one kind byte, then the msgpack body (msgspec).

The kind byte of each type is given explicitly (``MsgspecCodec({0: Ping, 1: Pong})``), never
derived from a position, so reordering or removing a type cannot silently change what another
type's byte means; both sides build their codec from the same mapping. No pickle ever crosses.

Large ``bytes`` fields can travel *out of band* (kind byte ``OOB_KIND``), so that the sender
copies them once, straight into the ring, instead of encoding them into a new buffer first:

    OOB_KIND | kind u8 | n u8 | body_len u32 | n x (slot u8, length u64) | body | n payloads

``body`` is the msgpack of the message with those n fields set to ``b""``; ``slot`` indexes the
type's eligible fields (``oob_fields``); the payloads follow in table order. The receiver
decodes the body, then copies each payload into a new ``bytes`` (one copy) and sets the field:
it owns everything it returns. Eligible are top-level fields declared ``bytes`` or
``Optional[bytes]`` without length constraints, in types without ``__post_init__`` (a
placeholder must not reach user validation); only values that are ``bytes`` of at least
``OOB_MIN`` bytes go out of band. Everything else is plain msgpack, as is ``encode()``.
"""

from __future__ import annotations

import operator
import struct
from typing import Any, Iterable, Mapping, Optional, Union, cast

import msgspec

_FORBIDDEN = (msgspec.Raw, memoryview)

OOB_KIND = 255  # the kind byte of an out-of-band frame; so a codec has at most 255 types
OOB_MIN = 64 * 1024  # a bytes value this large is sent out of band (below, encoding is cheaper)
_OOB_HEAD = struct.Struct("<BBI")  # real kind, number of out-of-band fields, body length
_OOB_FIELD = struct.Struct("<BQ")  # slot in the type's oob_fields, payload length


def _oob_eligible(t: type[msgspec.Struct]) -> tuple[str, ...]:
    """The fields of ``t`` whose bytes may travel out of band (see the module docstring)."""
    if hasattr(t, "__post_init__"):
        return ()
    names = []
    info = msgspec.inspect.type_info(t)
    assert isinstance(info, msgspec.inspect.StructType)  # MsgspecCodec checked it is a Struct
    for f in info.fields:
        ft = f.type
        options = ft.types if isinstance(ft, msgspec.inspect.UnionType) else (ft,)
        plain = [o for o in options if not isinstance(o, msgspec.inspect.NoneType)]
        if (
            len(plain) == 1
            and isinstance(plain[0], msgspec.inspect.BytesType)
            and plain[0].min_length is None
            and plain[0].max_length is None
        ):
            names.append(f.name)
    return tuple(names[:255])


def _probe(names: tuple) -> Any:
    if not names:
        return None
    if len(names) == 1:
        return operator.attrgetter(names[0])
    getter = operator.attrgetter(*names)

    def largest(msg: Any) -> Any:
        return max((v for v in getter(msg) if type(v) is bytes), key=len, default=None)

    return largest


class _UnknownKind:
    """The decoder of a kind byte outside the codec (IndexError: the ring reports it by name)."""

    def __init__(self, kind: int, known: tuple) -> None:
        self.kind, self.known = kind, known

    def decode(self, buf: Any) -> Any:
        raise IndexError(f"kind {self.kind} (the codec's kinds are {list(self.known)})")


def _kinds(types: Union[Mapping[int, type], Iterable[tuple[int, type]]]) -> dict[int, type]:
    """Validate the kind -> type table: explicit ints below OOB_KIND, no kind or type twice."""
    pairs = list(types.items() if isinstance(types, Mapping) else types)
    if not all(isinstance(p, tuple) and len(p) == 2 for p in pairs):
        raise TypeError(
            "MsgspecCodec takes a mapping kind byte -> type, or (kind, type) pairs: a kind is never a position"
        )
    if not pairs:
        raise ValueError("MsgspecCodec needs at least one message type")
    out: dict[int, type] = {}
    for kind, t in pairs:
        if isinstance(kind, bool) or not isinstance(kind, int) or not 0 <= kind < OOB_KIND:
            raise ValueError(f"MsgspecCodec kinds are ints in [0, {OOB_KIND}), got {kind!r} for {t!r}")
        if kind in out:
            raise ValueError(f"MsgspecCodec kind {kind} given twice ({out[kind]!r} and {t!r})")
        out[int(kind)] = t
    if len(set(out.values())) != len(out):
        raise ValueError("MsgspecCodec types must be distinct (one kind per type)")
    return out


class _OobDecoder:
    """Decodes an out-of-band frame (after its OOB_KIND byte) into an owned message. Trusts
    nothing in ``buf``: every length is read once and checked against the frame."""

    def __init__(self, decoders: tuple, fields: tuple, frozen: tuple) -> None:
        self.decoders, self.fields, self.frozen = decoders, fields, frozen

    def decode(self, buf: Any) -> Any:
        size = len(buf)
        kind, n, body_len = _OOB_HEAD.unpack_from(buf, 0)
        names = self.fields[kind] if kind < len(self.fields) else ()
        if not 0 < n <= len(names):
            raise msgspec.DecodeError(
                f"out-of-band frame of kind {kind} with {n} fields (the type has {len(names)} eligible)"
            )
        pos = _OOB_HEAD.size
        table = []
        for _ in range(n):
            slot, length = _OOB_FIELD.unpack_from(buf, pos)
            pos += _OOB_FIELD.size
            if slot >= len(names):
                raise msgspec.DecodeError(f"out-of-band field slot {slot} of {len(names)}")
            table.append((names[slot], length))
        end = pos + body_len
        if end > size:
            raise msgspec.DecodeError(f"out-of-band body of {body_len} bytes overruns the frame")
        msg = self.decoders[kind].decode(buf[pos:end])
        values = {}
        for name, length in table:
            stop = end + length
            if stop > size or name in values:
                raise msgspec.DecodeError(f"out-of-band field {name!r} overruns the frame or repeats")
            values[name] = bytes(buf[end:stop])  # the one copy, out of shared memory
            end = stop
        if end != size:
            raise msgspec.DecodeError(f"out-of-band frame has {size - end} stray bytes")
        if self.frozen[kind]:
            return msgspec.structs.replace(msg, **values)
        for name, value in values.items():
            setattr(msg, name, value)
        return msg


class MsgspecCodec:
    """Encode/decode msgspec Structs with a one-byte kind prefix.

    Built from a mapping (or pairs) kind byte -> type; see the module docstring.

    ``encode(msg) -> bytes`` and ``decode(buf) -> msg`` give the whole frame; the channel uses
    ``kind_of``/``encode_body``/``oob_parts`` and ``decoders`` directly, so the kind byte is
    written by the ring and never concatenated in Python. Decoding always produces owned
    objects: types with ``msgspec.Raw`` or ``memoryview`` fields are refused, because those
    would keep pointing into shared memory after its space is released.
    """

    def __init__(self, types: Union[Mapping[int, type], Iterable[tuple[int, type]]]) -> None:
        by_kind = _kinds(types)
        for t in by_kind.values():
            if not (isinstance(t, type) and issubclass(t, msgspec.Struct)):
                raise TypeError(f"MsgspecCodec types must be msgspec.Struct subclasses, got {t!r}")
            for f in msgspec.structs.fields(t):
                if f.type in _FORBIDDEN:
                    raise TypeError(
                        f"{t.__name__}.{f.name} is {f.type.__name__}: it would alias shared "
                        "memory after decode; use bytes"
                    )
        structs = cast(dict[int, type[msgspec.Struct]], by_kind)  # as checked just above
        self.types = tuple(structs.values())
        self.kind_of = {t: k for k, t in structs.items()}  # type -> kind byte
        kinds = range(OOB_KIND)
        # kind byte -> eligible field names (empty for kinds outside the codec)
        self.oob_fields = tuple(_oob_eligible(structs[k]) if k in structs else () for k in kinds)
        # type -> (kind byte, probe or None): one lookup on the send path; probe(msg) is the
        # value of the type's eligible field (or the largest bytes among several), for a
        # cheap "is anything large enough to go out of band?"
        self.send_info = {t: (k, _probe(self.oob_fields[k])) for k, t in structs.items()}
        self.encode_body = msgspec.msgpack.Encoder().encode  # msg -> msgpack body (no kind byte)
        known = tuple(sorted(structs))
        typed: tuple[Any, ...] = tuple(
            msgspec.msgpack.Decoder(structs[k]) if k in structs else _UnknownKind(k, known) for k in kinds
        )
        frozen = tuple(k in structs and structs[k].__struct_config__.frozen for k in kinds)
        # kind byte -> decoder, for all 256 values (unknown kinds raise IndexError when used)
        self.decoders = typed + (_OobDecoder(typed, self.oob_fields, frozen),)

    def kind_and_body(self, msg: Any) -> tuple[int, bytes]:
        """The kind byte and msgpack body of ``msg``; TypeError for a type not in the codec."""
        try:
            kind = self.kind_of[type(msg)]
        except KeyError:
            raise TypeError(
                f"cannot send {type(msg).__name__}: not one of this codec's types "
                f"({', '.join(t.__name__ for t in self.types)})"
            ) from None
        return kind, self.encode_body(msg)

    def oob_parts(self, msg: Any, kind: int, names: tuple, min_size: int = OOB_MIN) -> Optional[list]:
        """The out-of-band frame of ``msg`` (after its OOB_KIND byte) as a list of parts: the
        header with the small body, then each large payload itself (not copied). None when no
        field in ``names`` holds ``bytes`` of at least ``min_size`` bytes."""
        big = None
        for slot, name in enumerate(names):
            value = getattr(msg, name)
            if type(value) is bytes and len(value) >= min_size:
                if big is None:
                    big = []
                big.append((slot, name, value))
        if big is None:
            return None
        body = self.encode_body(msgspec.structs.replace(msg, **{name: b"" for _, name, _ in big}))
        head = [_OOB_HEAD.pack(kind, len(big), len(body))]
        head += [_OOB_FIELD.pack(slot, len(value)) for slot, _, value in big]
        head.append(body)
        return [b"".join(head)] + [value for _, _, value in big]

    def encode(self, msg: Any) -> bytes:
        kind, body = self.kind_and_body(msg)
        return bytes((kind,)) + body

    def decode_at(self, buf: Any, offset: int, length: int) -> Any:
        """Decode the frame at ``buf[offset:offset+length]`` (any buffer, e.g. mapped memory)."""
        if length < 1:
            raise msgspec.DecodeError("empty frame: no kind byte")
        kind = buf[offset]
        if isinstance(self.decoders[kind], _UnknownKind):
            raise msgspec.DecodeError(
                f"unknown message kind {kind} (the codec's kinds are {sorted(self.kind_of.values())})"
            )
        return self.decoders[kind].decode(buf[offset + 1 : offset + length])

    def decode(self, frame: Any) -> Any:
        view = memoryview(frame)
        return self.decode_at(view, 0, len(view))
