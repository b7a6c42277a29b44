"""The wire format, and the agent's connection loop fed scripted and malformed frames over a
socketpair: every bad frame gets an error reply, and the agent keeps serving."""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import threading
from typing import Any, Dict, Iterator, Tuple

import pytest

from probing.agent.columns import TableBuilder
from probing.agent.server import AgentServer
from probing.protocol.frames import (
    MAGIC,
    MAX_HEADER_BYTES,
    MAX_REPLY_BYTES,
    MAX_REQUEST_BYTES,
    PREFIX,
    FrameError,
    FrameReader,
    encode_header,
    frame_buffers,
    json_dumps,
    json_loads,
    recv_frame,
    send_buffers,
    send_frame,
)
from probing.protocol.messages import PROTOCOL_VERSION, request
from probing.protocol.tables import decode_table


@pytest.fixture
def agent_end(tmp_path: Any) -> Iterator[Tuple[socket.socket, threading.Thread, AgentServer]]:
    """One end of a socketpair served by a real agent connection loop; the other end is ours."""
    server = AgentServer.bind(str(tmp_path))
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ours.settimeout(10)
    thread = threading.Thread(target=server._serve_connection, args=(theirs,), daemon=True)
    thread.start()
    yield ours, thread, server
    ours.close()
    server.stop()
    thread.join(5)


def call(sock: socket.socket, header: Dict[str, Any]) -> Dict[str, Any]:
    send_frame(sock, header)
    frame = recv_frame(sock, MAX_REPLY_BYTES)
    assert frame is not None
    return frame.header


def raw_frame(header_bytes: bytes, payload: bytes = b"", magic: bytes = MAGIC) -> bytes:
    return PREFIX.pack(magic, len(header_bytes), len(payload)) + header_bytes + payload


def test_json_codec_matches_the_json_module() -> None:
    value = {"id": 1, "method": "eval", "params": {"code": "print('é\\n\"')", "f": 1.5, "n": None}}
    assert json.loads(json_dumps(value)) == value
    assert json_loads(json.dumps(value)) == value
    with pytest.raises(ValueError):
        json_loads('{"a": 1} trailing')
    with pytest.raises(ValueError):
        json_loads("{not json")


def test_malformed_json_is_a_value_error_where_json_was_never_imported() -> None:
    """The agent and the CLI's fast path do not import json: there, the C scanner fails on some
    malformed texts with a SystemError, and a peer's deep nesting with a RecursionError. Every
    reader catches ValueError only, so both must arrive as one."""
    code = (
        "import sys\n"
        "from probing.protocol.frames import json_loads\n"
        "assert 'json.decoder' not in sys.modules\n"
        "for text in ('{not json', '{\"a\" 1}', '[' * 100000, '{\"a\":' * 100000):\n"
        "    try:\n"
        "        json_loads(text)\n"
        "    except ValueError:\n"
        "        continue\n"
        "    raise SystemExit('parsed: ' + text[:20])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_table_round_trip_keeps_types_and_nulls() -> None:
    builder = TableBuilder(
        "t.x",
        [
            ("i", "BIGINT"),
            ("f", "DOUBLE"),
            ("b", "BOOLEAN"),
            ("s", "VARCHAR"),
            ("j", "JSON"),
            ("l", "VARCHAR[]"),
        ],
    )
    builder.append((1, 0.5, True, "a", {"k": 1}, ["x", "y"]))
    builder.append((None, None, None, None, None, None))
    builder.append((-(2**62), float("inf"), False, "é\udcff", "[]", []))
    descriptor, chunks = builder.encode()
    payload = b"".join(bytes(chunk) for chunk in chunks)
    table = decode_table(json.loads(json.dumps(descriptor)), bytearray(payload))
    assert table.rows == 3
    assert table.to_rows() == [
        {"i": 1, "f": 0.5, "b": True, "s": "a", "j": '{"k": 1}', "l": '["x", "y"]'},
        {"i": None, "f": None, "b": None, "s": None, "j": None, "l": None},
        {"i": -(2**62), "f": float("inf"), "b": False, "s": "é\\udcff", "j": "[]", "l": "[]"},
    ]


def test_a_table_descriptor_that_does_not_fit_its_payload_is_refused() -> None:
    builder = TableBuilder("t.x", [("i", "BIGINT")])
    builder.append((1,))
    descriptor, chunks = builder.encode()
    with pytest.raises(FrameError):
        decode_table(dict(descriptor, rows=5), bytearray(b"".join(bytes(c) for c in chunks)))


def test_hello_reports_the_process(agent_end: Any) -> None:
    sock, _, _ = agent_end
    reply = call(sock, request(1, "hello", {"protocol": PROTOCOL_VERSION}))
    assert reply["ok"] and reply["id"] == 1
    assert reply["result"]["protocol"] == PROTOCOL_VERSION
    assert {"backtrace", "eval", "table", "tables"} <= set(reply["result"]["capabilities"])


def test_a_client_of_another_protocol_version_is_told_so(agent_end: Any) -> None:
    sock, _, _ = agent_end
    reply = call(sock, request(1, "hello", {"protocol": 999}))
    assert not reply["ok"] and reply["error"]["type"] == "ProtocolMismatch"


def test_unknown_method_gets_an_error_and_the_connection_survives(agent_end: Any) -> None:
    sock, _, _ = agent_end
    reply = call(sock, request(7, "no_such_method"))
    assert reply == {
        "id": 7,
        "ok": False,
        "error": {"type": "UnknownMethod", "message": reply["error"]["message"]},
    }
    assert "no_such_method" in reply["error"]["message"]
    assert call(sock, request(8, "ping"))["ok"]


@pytest.mark.parametrize(
    "header_bytes, expected",
    [
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"id": 3}', "no 'method'"),
        (b'{"id": 3, "method": "ping", "params": [1]}', "'params' must be an object"),
        (b'{"id": [1], "method": "ping"}', "'id' must be"),
    ],
)
def test_malformed_frames_get_an_error_and_the_connection_survives(
    agent_end: Any, header_bytes: bytes, expected: str
) -> None:
    sock, _, _ = agent_end
    sock.sendall(raw_frame(header_bytes))
    frame = recv_frame(sock, MAX_REPLY_BYTES)
    assert frame is not None and frame.header["ok"] is False
    assert expected in frame.header["error"]["message"]
    assert call(sock, request(9, "ping"))["result"] == {"pong": True}


def test_bad_magic_gets_an_error_then_the_connection_closes(agent_end: Any) -> None:
    sock, thread, _ = agent_end
    sock.sendall(raw_frame(b"{}", magic=b"HTTP"))
    frame = recv_frame(sock, MAX_REPLY_BYTES)
    assert frame is not None and "bad magic" in frame.header["error"]["message"]
    # Closed with our unread bytes in its buffer, the agent's side may reset rather than FIN.
    try:
        assert recv_frame(sock, MAX_REPLY_BYTES) is None
    except ConnectionResetError:
        pass
    thread.join(5)
    assert not thread.is_alive()


def test_oversized_frame_gets_an_error_then_the_connection_closes(agent_end: Any) -> None:
    sock, thread, _ = agent_end
    sock.sendall(PREFIX.pack(MAGIC, 10, MAX_REQUEST_BYTES))
    frame = recv_frame(sock, MAX_REPLY_BYTES)
    assert frame is not None and "exceeds the cap" in frame.header["error"]["message"]
    thread.join(5)
    assert not thread.is_alive()


def test_oversized_header_is_refused(agent_end: Any) -> None:
    sock, _, _ = agent_end
    sock.sendall(PREFIX.pack(MAGIC, MAX_HEADER_BYTES + 1, 0))
    frame = recv_frame(sock, MAX_REPLY_BYTES)
    assert frame is not None and "header" in frame.header["error"]["message"]


def test_truncated_frame_ends_that_connection_only(agent_end: Any) -> None:
    sock, thread, server = agent_end
    sock.sendall(raw_frame(b'{"id": 1, "method": "ping"}')[:10])
    sock.shutdown(socket.SHUT_WR)
    thread.join(5)
    assert not thread.is_alive()
    # The agent itself is unharmed: a fresh connection is served.
    server.start()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as fresh:
        fresh.settimeout(10)
        fresh.connect(server.path)
        assert call(fresh, request(1, "ping"))["ok"]


def test_table_request_ships_typed_columns(agent_end: Any) -> None:
    sock, _, _ = agent_end
    send_frame(sock, request(1, "table", {"name": "python.threads"}))
    frame = recv_frame(sock, MAX_REPLY_BYTES)
    assert frame is not None and frame.header["ok"]
    table = decode_table(frame.header["result"]["table"], frame.payload)
    assert table.name == "python.threads" and table.rows >= 1
    assert [column.name for column in table.columns][:4] == [
        "pid",
        "thread_id",
        "native_id",
        "name",
    ]


def test_unknown_table_is_an_error(agent_end: Any) -> None:
    sock, _, _ = agent_end
    reply = call(sock, request(1, "table", {"name": "python.nope"}))
    assert reply["error"]["type"] == "NotFound" and "python.backtrace" in reply["error"]["message"]


def test_a_frame_split_into_single_bytes_is_read_whole(agent_end: Any) -> None:
    sock, _, _ = agent_end
    data = raw_frame(encode_header(request(5, "ping")))
    for byte in data:
        sock.send(bytes([byte]))
    frame = recv_frame(sock, MAX_REPLY_BYTES)
    assert frame is not None and frame.header["id"] == 5 and frame.header["ok"]


def test_prefix_layout_is_stable() -> None:
    assert PREFIX.size == 12
    assert struct.unpack(">4sII", PREFIX.pack(b"PRB1", 1, 2)) == (b"PRB1", 1, 2)


def test_pipelined_requests_are_answered_in_order(agent_end: Any) -> None:
    sock, _, _ = agent_end
    buffers = []
    for request_id, method in ((1, "hello"), (2, "ping"), (3, "nope"), (4, "ping")):
        buffers += frame_buffers(request(request_id, method, {}))
    send_buffers(sock, buffers)
    reader = FrameReader(sock, MAX_REPLY_BYTES)
    replies = [reader.read() for _ in range(4)]
    assert [(frame.header["id"], frame.header["ok"]) for frame in replies if frame] == [
        (1, True),
        (2, True),
        (3, False),
        (4, True),
    ]


def test_after_a_refused_hello_nothing_runs_on_that_connection(agent_end: Any) -> None:
    sock, _, _ = agent_end
    buffers = frame_buffers(request(1, "hello", {"protocol": 999}))
    buffers += frame_buffers(request(2, "eval", {"code": "import os; os._exit(3)"}))
    send_buffers(sock, buffers)
    reader = FrameReader(sock, MAX_REPLY_BYTES)
    first, second = reader.read(), reader.read()
    assert first is not None and first.header["error"]["type"] == "ProtocolMismatch"
    assert second is not None and second.header["error"]["type"] == "ProtocolMismatch"


def test_large_frames_go_out_whole_through_sendmsg() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    chunks = [bytes([n]) * (300_000 + n) for n in range(8)]  # over the join limit
    sender = threading.Thread(target=send_frame, args=(ours, {"id": 1, "ok": True}, chunks))
    sender.start()
    frame = FrameReader(theirs, MAX_REPLY_BYTES).read()
    sender.join(10)
    ours.close()
    theirs.close()
    assert frame is not None and bytes(frame.payload) == b"".join(chunks)


def test_a_first_request_slower_than_its_wait_is_named_not_the_hello(tmp_path: Any) -> None:
    """The agent sends the hello's reply with the first request's, in one send: a client that
    waits out the request names the request, not the hello (a 12.5 s `memory --growth` was once
    reported as an agent that did not answer its hello)."""
    from probing.client.connection import Client
    from probing.errors import AgentTimeout

    server = AgentServer.bind(str(tmp_path))
    server.start()
    try:
        with Client(server.path, 5.0) as client, pytest.raises(AgentTimeout) as late:
            client.call("watch", {"duration": 1.5, "samples": 2}, timeout=0.3)
        assert late.value.message == "the agent did not answer 'watch' within 0.3 s"
    finally:
        server.stop()
