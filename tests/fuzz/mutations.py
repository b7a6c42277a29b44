"""Inputs for the fuzz layer (harness.py): mutations of a seed corpus that keep what must agree
for a change to reach a decoder's checks (frame lengths, sealed records' MACs, JSON), tokens that
broke parsers before, and inputs drawn from scratch.

A mutation is `mutate(draw, data, seeds) -> bytes`: `draw` is hypothesis' (every choice goes
through it, so that an input shrinks and replays), `seeds` the corpus it came from (for splicing).
harness.py re-exports every name here.
"""

from __future__ import annotations

import json
import math
import socket
import struct
import threading
from typing import Any, Callable, List, Optional, Sequence, Tuple

from hypothesis import strategies as st

# Inputs drawn from scratch, and what a mutation may add, stay this small: the point is odd
# shapes, not volume (huge *announced* lengths cost nothing to write).
MAX_SCRATCH_BYTES = 4096
# What one repetition may add to an input: enough for many threads, rows or lines.
MAX_GROWTH_BYTES = 1 << 20

Draw = Callable[[st.SearchStrategy[Any]], Any]
Mutation = Callable[[Draw, bytes, Sequence[bytes]], bytes]


# --- mutations of bytes ------------------------------------------------------------------------

# Tokens that broke parsers before: a lone surrogate as UTF-8 bytes and as JSON escapes, numbers
# JSON has no room for, quotes and brackets, terminal escapes, deep nesting.
TOKENS = (
    b"\xed\xa0\x80", b"\xed\xb3\xbf", b"\\ud800", b"\\udcff", b'"\\ud83d"', b"NaN", b"Infinity",
    b"-Infinity", b"1e308", b"-1e308", b"1e999", b"4.9e-324", b"99999999999999999999999",
    b"-9223372036854775809", b"18446744073709551616", b"-1", b"0", b"null", b"true", b'""', b'"',
    b"\\", b"{", b"}", b"[", b"]", b",", b":", b"\x00", b"\xff\xfe", b"\x1b[2J", b"\xe2\x80\xae",
    b"[" * 5000, b"{\"a\":" * 3000,
)  # fmt: skip
BYTE_VALUES = (0x00, 0x01, 0x7F, 0x80, 0xFF, 0xED, 0x22, 0x5C, 0x7B, 0x5B, 0x0A, 0x30, 0x39)
# Lengths, offsets and counts that broke bounds checks before.
BIG_NUMBERS = (0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, 0x40000000, 0x01000000, 0x00100001, 0xFFFF, 0)


def _position(draw: Draw, data: bytes, end: bool = False) -> int:
    return int(draw(st.integers(0, len(data) if end else max(len(data) - 1, 0))))


def flip_bits(draw: Draw, data: bytes, seeds: Sequence[bytes]) -> bytes:
    if not data:
        return data
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 8))):
        at = _position(draw, data)
        out[at] ^= 1 << draw(st.integers(0, 7))
    return bytes(out)


def set_bytes(draw: Draw, data: bytes, seeds: Sequence[bytes]) -> bytes:
    if not data:
        return data
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        out[_position(draw, data)] = draw(st.sampled_from(BYTE_VALUES) | st.integers(0, 255))
    return bytes(out)


def truncate(draw: Draw, data: bytes, seeds: Sequence[bytes]) -> bytes:
    return data[: _position(draw, data, end=True)]


def cut_out(draw: Draw, data: bytes, seeds: Sequence[bytes]) -> bytes:
    start = _position(draw, data, end=True)
    return data[:start] + data[start + draw(st.integers(1, 64)) :]


def duplicate(draw: Draw, data: bytes, seeds: Sequence[bytes]) -> bytes:
    start = _position(draw, data, end=True)
    piece = data[start : start + draw(st.integers(1, 256))]
    at = _position(draw, data, end=True)
    return data[:at] + piece * draw(st.integers(1, 4)) + data[at:]


def splice(draw: Draw, data: bytes, seeds: Sequence[bytes]) -> bytes:
    other = draw(st.sampled_from(list(seeds))) if seeds else data
    return data[: _position(draw, data, end=True)] + other[_position(draw, other, end=True) :]


def insert_token(draw: Draw, data: bytes, seeds: Sequence[bytes]) -> bytes:
    at = _position(draw, data, end=True)
    replace = draw(st.integers(0, 4))
    return data[:at] + draw(st.sampled_from(TOKENS)) + data[at + replace :]


def huge_length(draw: Draw, data: bytes, seeds: Sequence[bytes]) -> bytes:
    """A 4- or 8-byte number written over the input, big- or little-endian: where it lands on a
    length, an offset or a count, the decoder meets a size it must not believe."""
    wide = draw(st.booleans())
    number = draw(st.sampled_from(BIG_NUMBERS + (len(data), len(data) + 1)) | st.integers(0, 2**32 - 1))
    packed = struct.pack((">" if draw(st.booleans()) else "<") + ("Q" if wide else "I"), number)
    at = _position(draw, data, end=True)
    return data[:at] + packed + data[at + len(packed) :]


BYTES: Tuple[Mutation, ...] = (flip_bits, set_bytes, truncate, cut_out, duplicate, splice, insert_token,
                               huge_length)  # fmt: skip


# --- mutations of JSON documents ---------------------------------------------------------------

_DEEP = "\x00deep nesting\x00"  # stands for nesting json.dumps cannot write; replaced after
INTERESTING_VALUES: Tuple[Any, ...] = (
    math.nan, math.inf, -math.inf, 1e308, -1e308, 5e-324, 0.5, -0.0, 2**63 - 1, 2**63, -(2**63) - 1,
    2**64, 10**30, -1, 0, 1, True, False, None, "", "\ud800", "\udcff", "a\udc80b", "\x1b[2J\r",
    "\u202e\u2028", "x" * 70000, [], {}, [None], {"": None}, [[[]]], _DEEP,
)  # fmt: skip


def _nodes(value: Any, limit: int = 4000) -> List[Tuple[Any, Any]]:
    """(container, key) of every value inside `value`, breadth first, at most `limit`."""
    found: List[Tuple[Any, Any]] = []
    queue = [value]
    while queue and len(found) < limit:
        container = queue.pop(0)
        keys = list(container) if isinstance(container, dict) else range(len(container))
        for key in keys:
            found.append((container, key))
            if isinstance(container[key], (dict, list)):
                queue.append(container[key])
    return found


def _near(value: Any) -> List[Any]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return []
    if isinstance(value, float):
        return [value * 2, -value, value + 1e300]
    return [value + 1, value - 1, value * 2, -value, value + 2**32, value * 8 + 7]


def change_json(draw: Draw, value: Any) -> Any:
    """`value` (a parsed document) with one of its values changed, removed or repeated."""
    nodes = _nodes(value) if isinstance(value, (dict, list)) else []
    if not nodes:
        return draw(st.sampled_from(INTERESTING_VALUES))
    container, key = draw(st.sampled_from(nodes))
    action = draw(st.sampled_from(("replace", "replace", "near", "remove", "repeat", "wrap")))
    if action == "near" and _near(container[key]):
        container[key] = draw(st.sampled_from(_near(container[key])))
    elif action == "remove":
        del container[key]
    elif action == "repeat" and isinstance(container, list):
        size = len(json.dumps(container[key], default=str)) + 1
        count = draw(st.sampled_from((1, 10, 1000)))
        container[key:key] = [container[key]] * max(1, min(count, MAX_GROWTH_BYTES // size))
    elif action == "wrap":
        container[key] = [container[key]] if draw(st.booleans()) else {"": container[key]}
    else:
        container[key] = draw(st.sampled_from(INTERESTING_VALUES))
    return value


def dump_json(draw: Draw, value: Any) -> bytes:
    """JSON text as a peer might write it: ASCII or not (a lone surrogate then goes out as the
    three bytes no UTF-8 decoder accepts), NaN and Infinity as Python writes them."""
    text = json.dumps(value, allow_nan=True, ensure_ascii=draw(st.booleans()))
    depth = draw(st.sampled_from((100, 5000, 100000)))
    text = text.replace(json.dumps(_DEEP), "[" * depth + "]" * depth)
    return text.encode("utf-8", "surrogatepass")


def _parse_json(data: bytes) -> Any:
    try:
        return json.loads(data.decode("utf-8", "surrogatepass"))
    except (ValueError, RecursionError):
        return None


def json_values() -> Mutation:
    """A mutation of an input that is one JSON document; other inputs get a byte mutation."""

    def mutate(draw: Draw, data: bytes, seeds: Sequence[bytes]) -> bytes:
        value = _parse_json(data)
        if value is None:
            return draw(st.sampled_from(BYTES))(draw, data, seeds)  # type: ignore[no-any-return]
        return dump_json(draw, change_json(draw, value))

    return mutate


# --- mutations of protocol frames ----------------------------------------------------------------

_PREFIX = struct.Struct(">4sII")


def split_frames(data: bytes, prefix: int = 0) -> Optional[List[Tuple[bytes, bytes]]]:
    """(header, payload) of each whole frame after `prefix` bytes; None unless the stream is
    nothing but whole frames."""
    frames, at = [], prefix
    while at < len(data):
        if len(data) - at < _PREFIX.size:
            return None
        _, header, payload = _PREFIX.unpack_from(data, at)
        end = at + _PREFIX.size + header + payload
        if end > len(data):
            return None
        frames.append((data[at + _PREFIX.size : at + _PREFIX.size + header], data[end - payload : end]))
        at = end
    return frames


def join_frames(frames: Sequence[Tuple[bytes, bytes]], magic: bytes = b"PRB1") -> bytes:
    return b"".join(_PREFIX.pack(magic, len(head), len(payload)) + head + payload for head, payload in frames)


def _change_payload(draw: Draw, payload: bytes) -> bytes:
    """A payload with one of its aligned numbers (an int32 dictionary code or length, an int64
    value) set to one that lies, or its bytes changed."""
    if len(payload) >= 8 and draw(st.booleans()):
        width = draw(st.sampled_from((4, 8)))
        at = draw(st.integers(0, len(payload) // width - 1)) * width
        number = draw(st.sampled_from((-1, -2, 2**31 - 1, -(2**31), 1 << 20, 3, 0)))
        packed = struct.pack("=i" if width == 4 else "=q", number)
        return payload[:at] + packed + payload[at + width :]
    return draw(st.sampled_from(BYTES))(draw, payload, ())  # type: ignore[no-any-return]


def frames(prefix: int = 0) -> Mutation:
    """A mutation of a stream of protocol frames (after `prefix` bytes: a record's magic): one
    header's JSON changed, a payload's numbers changed, a length field that lies, frames dropped,
    repeated or swapped. The other frames stay whole, so the change reaches the decoder's checks
    of what a frame says rather than its framing alone."""

    def mutate(draw: Draw, data: bytes, seeds: Sequence[bytes]) -> bytes:
        parsed = split_frames(data, prefix)
        if not parsed:
            return draw(st.sampled_from(BYTES))(draw, data, seeds)  # type: ignore[no-any-return]
        head, stream = data[:prefix], list(parsed)
        # The last frame half the time: in a reply stream it is the answer, behind the hello.
        index = len(stream) - 1 if draw(st.booleans()) else draw(st.integers(0, len(stream) - 1))
        header, payload = stream[index]
        action = draw(st.sampled_from(("header", "header", "header", "payload", "payload", "lengths",
                                       "drop", "repeat", "swap")))  # fmt: skip
        if action == "header":
            value = _parse_json(header)
            header = dump_json(draw, change_json(draw, value)) if value is not None else header
            stream[index] = (header, payload)
        elif action == "payload":
            stream[index] = (header, _change_payload(draw, payload))
        elif action == "drop":
            del stream[index]
        elif action == "repeat":
            stream.insert(index, stream[index])
        elif action == "swap" and len(stream) > 1:
            other = draw(st.integers(0, len(stream) - 1))
            stream[index], stream[other] = stream[other], stream[index]
        elif action == "lengths":
            before = join_frames(stream[:index])
            lengths = (draw(st.sampled_from(BIG_NUMBERS) | st.integers(0, 2**32 - 1)) for _ in range(2))
            lying = _PREFIX.pack(b"PRB1", *lengths)
            return head + before + lying + header + payload + join_frames(stream[index + 1 :])
        return head + join_frames(stream)

    return mutate


# --- mutations of sealed records (TCP after the handshake) --------------------------------------

_RECORD_LENGTH = struct.Struct(">I")
MAC_BYTES = 32
KEY_BYTES = 32


def open_records(data: bytes) -> Tuple[bytes, bool]:
    """The data of the records in `data`, their MACs unchecked; whether `data` held whole records
    only."""
    plain, at = b"", 0
    while len(data) - at >= _RECORD_LENGTH.size:
        (length,) = _RECORD_LENGTH.unpack_from(data, at)
        end = at + _RECORD_LENGTH.size + length + MAC_BYTES
        if end > len(data):
            return plain, False
        plain += data[at + _RECORD_LENGTH.size : end - MAC_BYTES]
        at = end
    return plain, at == len(data)


def seal_records(session_key: bytes, side: str, pieces: Sequence[bytes]) -> bytes:
    """`pieces` sealed as `side` seals them, one record each (through a real SealedSocket)."""
    from probing.protocol import sealed

    a, b = socket.socketpair()
    received: List[bytes] = []

    def receive() -> None:  # read while the pieces are sealed: a big one fills the socket's buffer
        while True:
            chunk = b.recv(1 << 16)
            if not chunk:
                return
            received.append(chunk)

    reader = threading.Thread(target=receive, name="fuzz-seal-reader")
    reader.start()
    sender = sealed.SealedSocket(a, session_key, side)
    try:
        for piece in pieces:
            if piece:
                sender.sendall(piece)
    finally:
        sender.close()
        reader.join(30)
        b.close()
    return b"".join(received)


def sealed(side: str, inner: Sequence[Mutation]) -> Mutation:
    """A mutation of `session key (32 bytes) + sealed records` as `side` sends them: what the
    records carry is changed by one of `inner` and sealed again under the same key, in records
    cut anywhere (a hostile job knows its own token: every record it sends passes the check).
    Sometimes the sealed bytes themselves are changed instead (a MAC or a length that lies)."""

    def mutate(draw: Draw, data: bytes, seeds: Sequence[bytes]) -> bytes:
        key, records = data[:KEY_BYTES], data[KEY_BYTES:]
        plain, whole = open_records(records)
        if len(key) < KEY_BYTES or not whole or draw(st.integers(0, 4)) == 0:
            return key + draw(st.sampled_from(BYTES))(draw, records, seeds)  # type: ignore[operator]
        plain_seeds = [open_records(each[KEY_BYTES:])[0] for each in seeds]
        plain = draw(st.sampled_from(list(inner)))(draw, plain, plain_seeds)
        cuts = sorted(draw(st.lists(st.integers(0, len(plain)), max_size=6)))
        pieces = [plain[start:end] for start, end in zip([0, *cuts], [*cuts, len(plain)])]
        return key + seal_records(key, side, pieces)

    return mutate


# --- mutations of text -----------------------------------------------------------------------


def text_values() -> Mutation:
    """A mutation of text (UTF-8, say a `.fatal` file): a line repeated, cut or emptied, a lone
    surrogate, a control character, a huge number or a very long line put in."""

    def mutate(draw: Draw, data: bytes, seeds: Sequence[bytes]) -> bytes:
        lines = data.split(b"\n")
        index = draw(st.integers(0, len(lines) - 1))
        piece = draw(st.sampled_from(TOKENS + (b"9" * 400, b"\r", b"\x85", b"\xe2\x80\xa8", b"a" * 70000)))
        action = draw(st.sampled_from(("insert", "replace", "repeat", "remove")))
        if action == "insert":
            at = draw(st.integers(0, len(lines[index])))
            lines[index] = lines[index][:at] + piece + lines[index][at:]
        elif action == "replace":
            lines[index] = piece
        elif action == "repeat":
            count = min(draw(st.sampled_from((1, 100, 10000))), MAX_GROWTH_BYTES // (len(lines[index]) + 1))
            lines[index:index] = [lines[index]] * max(1, count)
        else:
            del lines[index]
        return b"\n".join(lines)

    return mutate


# --- inputs from scratch -------------------------------------------------------------------------

_json_leaf = st.sampled_from(INTERESTING_VALUES[:-1]) | st.integers() | st.text(max_size=20) | st.floats()
json_documents = st.recursive(
    _json_leaf,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=30,
)


@st.composite
def json_texts(draw: Draw) -> bytes:
    """A JSON document drawn from scratch, written as a peer might write it."""
    return dump_json(draw, draw(json_documents))


@st.composite
def frame_streams(draw: Draw) -> bytes:
    """A stream of one to three frames with headers and payloads drawn from scratch."""
    count = draw(st.integers(1, 3))
    built = [(draw(json_texts()), draw(st.binary(max_size=256))) for _ in range(count)]
    return join_frames(built)


SCRATCH_BYTES = st.binary(max_size=MAX_SCRATCH_BYTES)


def sealed_streams(side: str) -> st.SearchStrategy[bytes]:
    """`session key + sealed records` drawn from scratch: frames (or bytes) sealed as `side`
    seals them, under a key drawn too, cut into records anywhere."""

    @st.composite
    def build(draw: Draw) -> bytes:
        key = draw(st.binary(min_size=KEY_BYTES, max_size=KEY_BYTES))
        plain = draw(frame_streams() | st.binary(max_size=512))
        cuts = sorted(draw(st.lists(st.integers(0, len(plain)), max_size=6)))
        return key + seal_records(key, side, [plain[a:b] for a, b in zip([0, *cuts], [*cuts, len(plain)])])

    return build()


def inputs(
    seeds: Sequence[bytes], mutations: Sequence[Mutation], scratch: st.SearchStrategy[bytes]
) -> st.SearchStrategy[bytes]:
    """Three inputs in four a seed changed by one to four mutations, one drawn from scratch."""

    @st.composite
    def mutated(draw: Draw) -> bytes:
        data: bytes = draw(st.sampled_from(list(seeds)))
        for _ in range(draw(st.integers(1, 4))):
            data = draw(st.sampled_from(list(mutations)))(draw, data, seeds)
        return data

    if not seeds:
        return scratch

    @st.composite
    def either(draw: Draw) -> bytes:
        return draw(scratch) if draw(st.integers(0, 3)) == 0 else draw(mutated())  # type: ignore[no-any-return]

    return either()
