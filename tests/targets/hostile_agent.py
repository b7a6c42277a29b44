"""A hostile job: it binds the agent socket (for its own PID, or `--as-pid N` for another
process's) in PROBING_SOCKET_DIR and answers every request with a crafted reply.

    python hostile_agent.py MODE [--as-pid N] [--path PATH]

It answers `hello` properly (unless the mode is about the hello), then each later request
as MODE says. Prints "ready" once it listens. Exits when its stdin closes.
"""

import json
import os
import socket
import struct
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

PREFIX = struct.Struct(">4sII")


def frame(header, payload=b"", announce=None):
    data = json.dumps(header).encode()
    length = len(payload) if announce is None else announce
    return PREFIX.pack(b"PRB1", len(data), length) + data + payload


def table(columns, rows, payload_size, **extra):
    descriptor = {"name": "python.backtrace", "rows": rows, "byteorder": sys.byteorder, "columns": columns}
    descriptor.update(extra)
    return descriptor


def column(name, kind, encoding, offset, length, **extra):
    entry = {"name": name, "type": kind, "encoding": encoding, "offset": offset, "length": length}
    entry.update(extra)
    return entry


def ok(request_id, result):
    return {"id": request_id, "ok": True, "result": result}


def replies(mode, request_id):
    """The bytes to send for a request, or None to stay silent."""
    if mode == "obliging":  # a well-formed answer: whoever asked would believe it
        return frame(ok(request_id, {"stdout": "", "stderr": "", "value": "hijacked"}))
    if mode == "huge-announce":  # more than the CLI's cap: refused at once
        return frame(ok(request_id, {}), b"", announce=(2 << 30) - 100)
    if mode == "huge-trickle":  # within the cap, but the bytes never come
        return frame(ok(request_id, {"table": {}}), b"x" * 1000, announce=900 << 20)
    if mode == "huge-close":
        return frame(ok(request_id, {"table": {}}), b"x" * 1000, announce=900 << 20) + b"CLOSE"
    if mode == "bad-magic":
        return b"HTTP/1.1 200 OK\r\n\r\n" + b"\0" * 64
    if mode == "garbage-json":
        data = b'{"id": 1, "ok": tru'
        return PREFIX.pack(b"PRB1", len(data), 0) + data
    if mode == "deep-json":
        data = b"[" * 100000 + b"]" * 100000
        return PREFIX.pack(b"PRB1", len(data), 0) + data
    if mode == "not-an-object":
        return frame([1, 2, 3])
    if mode == "result-not-object":
        return frame(ok(request_id, 5))
    if mode == "result-missing-keys":
        return frame(ok(request_id, {}))
    if mode == "wrong-types":
        return frame(ok(request_id, {"stdout": 12, "value": ["x"]}))
    if mode == "wrong-id":
        return frame(ok(request_id + 7, {"stdout": "", "value": "2"}))
    if mode == "error-reply-types":
        return frame({"id": request_id, "ok": False, "error": {"type": 3, "message": "boom", "traceback": 4}})
    if mode == "table-bad-offsets":
        columns = [column("pid", "BIGINT", "i64", 1 << 40, 8)]
        return frame(ok(request_id, {"table": table(columns, 1, 8)}), b"\0" * 8)
    if mode == "table-rows-mismatch":
        columns = [column("pid", "BIGINT", "i64", 0, 8)]
        return frame(ok(request_id, {"table": table(columns, 1000, 8)}), b"\0" * 8)
    if mode == "table-bad-type":
        columns = [column("pid", "BIGINT) FROM read_text('/etc/shadow') --", "i64", 0, 8)]
        return frame(ok(request_id, {"table": table(columns, 1, 8)}), b"\0" * 8)
    if mode == "table-dict-count":
        columns = [
            column(
                "thread_name", "VARCHAR", "dict", 0, 4,
                dict_count=1 << 40, dict_offset=8, dict_bytes_offset=16, dict_bytes_length=1,
            )
        ]  # fmt: skip
        return frame(ok(request_id, {"table": table(columns, 1, 24)}), b"\0" * 24)
    if mode == "table-dict-codes":
        payload = struct.pack("=i", 99) + b"\0" * 4 + struct.pack("=I", 1) + b"\0" * 4 + b"a"
        columns = [
            column(
                "thread_name", "VARCHAR", "dict", 0, 4,
                dict_count=1, dict_offset=8, dict_bytes_offset=16, dict_bytes_length=1,
            )
        ]  # fmt: skip
        return frame(ok(request_id, {"table": table(columns, 1, len(payload))}), payload)
    if mode == "table-not-object":
        return frame(ok(request_id, {"table": "no"}))
    raise SystemExit(f"unknown mode {mode}")


def hello(request_id, pid):
    info = {"pid": pid, "python_version": "3.11", "probing_version": "0.1.0", "argv": ["hostile"]}
    return frame(ok(request_id, info))


def serve(conn, mode, pid):
    buffer = b""
    try:
        while True:
            while len(buffer) < PREFIX.size or len(buffer) < PREFIX.size + sum(
                PREFIX.unpack_from(buffer)[1:]
            ):
                chunk = conn.recv(1 << 16)
                if not chunk:
                    return
                buffer += chunk
            _, header_length, payload_length = PREFIX.unpack_from(buffer)
            header = json.loads(buffer[PREFIX.size : PREFIX.size + header_length])
            buffer = buffer[PREFIX.size + header_length + payload_length :]
            if header["method"] == "hello":
                conn.sendall(hello(header["id"], pid))
                continue
            if header["method"] == "tables" and mode.startswith("table-"):
                from probing.schema.tables import AGENT_TABLES as TABLES

                described = [t.describe() for t in TABLES.values()]
                conn.sendall(frame(ok(header["id"], {"tables": described})))
                continue
            data = replies(mode, header["id"])
            closing = data.endswith(b"CLOSE")
            conn.sendall(data[:-5] if closing else data)
            if closing:
                return
    except OSError:
        return
    finally:
        if not mode.startswith("huge-trickle"):
            conn.close()


def main():
    mode = sys.argv[1]
    pid = os.getpid()
    path = None
    if "--as-pid" in sys.argv:
        pid = int(sys.argv[sys.argv.index("--as-pid") + 1])
    if "--path" in sys.argv:
        path = sys.argv[sys.argv.index("--path") + 1]
    if path is None:
        directory = os.environ["PROBING_SOCKET_DIR"]
        os.makedirs(directory, mode=0o700, exist_ok=True)
        path = os.path.join(directory, f"{pid}.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(16)

    def accept_loop():
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=serve, args=(conn, mode, os.getpid()), daemon=True).start()

    threading.Thread(target=accept_loop, daemon=True).start()
    print("ready", os.getpid(), flush=True)
    try:
        for _ in sys.stdin:
            pass
    finally:
        os.unlink(path)


main()
