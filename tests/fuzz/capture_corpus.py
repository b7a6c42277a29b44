"""Capture the fuzz layer's seed corpus (tests/fuzz/corpus/) from real processes.

    .venv/bin/python tests/fuzz/capture_corpus.py [FOLDER ...]

Every seed is what a real peer wrote: a real agent's replies on its Unix socket and over TCP (in
sealed records), a real TCP handshake, real `py-spy dump --json` output and real core-reader
output (outside/core_reader.py on real cores). The fuzz tests mutate them, so a seed reaches the
decoders' deep paths (a table's columns, a sealed record's frames) that bytes drawn from scratch
rarely do. Run by hand when the wire format changes; the tests only read the corpus. It writes
its seeds over the ones of the same names in the folders named, and leaves every other file alone:
`crash-*` files, inputs that once broke a decoder, stay (harness.py).

Formats, one input a file (harness.py reads them as bytes):
  replies/METHOD-WHAT.bin     the bytes an agent sent on its Unix socket: the hello reply, then the
                              reply to METHOD (the client sends both requests together)
  sealed/METHOD-WHAT.bin      session key (32 bytes), then the sealed records an agent sent over TCP
                              after the handshake: the hello reply and the reply to METHOD
  sealed-requests/WHAT.bin    session key (32 bytes), then the sealed records a client sent
  handshake-client/WHAT.bin   what an agent sent a client during the handshake: CHALLENGE, VERDICT
  handshake-agent/WHAT.bin    the agent's nonce (32 bytes), then the RESPONSE a client sent
  pyspy/WHAT.json|.stderr     py-spy dump's stdout, or its stderr when it failed
  core/WHAT.json              what outside/core_reader.py printed for a core (or a file that is none)
  endpoints/WHAT.txt          an endpoint a real agent published (its hello's), and the listen
                              addresses (PROBING_LISTEN) the tests and docs/ start jobs with
"""

from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
sys.path.insert(0, str(TESTS))
sys.path.insert(0, str(TESTS.parent))

from probing import __version__  # noqa: E402
from probing.outside import core as outside_core  # noqa: E402
from probing.outside.core_process import confinement_arguments, run_reader  # noqa: E402
from probing.outside.elf_core import open_core_file  # noqa: E402
from probing.protocol import auth, sealed  # noqa: E402
from probing.protocol.frames import MAX_REPLY_BYTES, PREFIX, frame_buffers, recv_frame, send_frame  # noqa: E402
from probing.protocol.messages import PROTOCOL_VERSION, request  # noqa: E402

CORPUS = HERE / "corpus"
# The token of the captured TCP sessions; the fuzz tests derive the same keys from it.
TOKEN = "probing fuzz corpus token, not a secret"

# (file stem, method, params): what the Python CLI asks an agent.
REQUESTS: List[Tuple[str, str, Dict[str, Any]]] = [
    ("backtrace-plain", "backtrace", {"locals": False, "thread": None}),
    ("backtrace-locals", "backtrace", {"locals": True, "thread": None}),
    ("table-threads", "table", {"name": "python.threads"}),
    ("table-process-info", "table", {"name": "process.info"}),
    ("table-process-memory", "table", {"name": "process.memory"}),
    ("table-gc", "table", {"name": "python.gc"}),
    ("table-no-such", "table", {"name": "no.such_table"}),
    ("tables-list", "tables", {}),
    ("eval-prints", "eval", {"code": "print('out \\u00e9'); 6 * 7", "frame": None, "timeout": 5.0}),
    ("eval-raises", "eval", {"code": "1 / 0", "frame": None, "timeout": 5.0}),
    ("hello-unknown-method", "no_such_method", {}),
]


# PROBING_LISTEN as the tests (tests/integration/test_listener.py) and docs/ set it.
LISTEN_ADDRESSES = [("loopback", "127.0.0.1:0"), ("auto", "auto"), ("port", "47000"), ("ipv6", "[::1]:47001")]


def request_bytes(method: str, params: Dict[str, Any]) -> bytes:
    """The hello and the request, as client/connection.py Client.send puts them on the wire."""
    hello = request(1, "hello", {"protocol": PROTOCOL_VERSION, "client": __version__})
    frames = frame_buffers(hello) + frame_buffers(request(2, method, params))
    return b"".join(bytes(chunk) for chunk in frames)


def whole_frames(data: bytes) -> int:
    count, at = 0, 0
    while len(data) - at >= PREFIX.size:
        _, header, payload = PREFIX.unpack_from(data, at)
        if len(data) - at < PREFIX.size + header + payload:
            break
        at += PREFIX.size + header + payload
        count += 1
    return count


def unix_replies(pid: int, method: str, params: Dict[str, Any]) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(os.path.join(os.environ["PROBING_SOCKET_DIR"], f"{pid}.sock"))
        sock.sendall(request_bytes(method, params))
        data = b""
        while whole_frames(data) < 2:
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            data += chunk
    return data


def open_records(key: bytes, label: bytes, data: bytes) -> bytes:
    """The plaintext of sealed records (each checked)."""
    mac = auth.HmacSha256(key)
    plain, at, sequence = b"", 0, 0
    while len(data) - at >= 4:
        (length,) = struct.unpack_from(">I", data, at)
        end = at + 4 + length + auth.MAC_BYTES
        if end > len(data):
            break
        record = data[at : at + 4 + length]
        assert mac.digest((label, struct.pack(">Q", sequence), record)) == data[end - auth.MAC_BYTES : end]
        plain += record[4:]
        at, sequence = end, sequence + 1
    return plain


def tcp_session(endpoint: str, token: str, method: str, params: Dict[str, Any]) -> Dict[str, bytes]:
    """One real TCP conversation: the handshake's bytes each way, and the sealed records each way."""
    host, _, port = endpoint.rpartition(":")
    key = auth.key_of(token)
    with socket.create_connection((host, int(port)), timeout=30) as raw:
        challenge = recv_exactly(raw, auth.CHALLENGE_BYTES)
        nonce, response = auth.respond(key, challenge)
        raw.sendall(response)
        verdict = recv_exactly(raw, auth.VERDICT_BYTES)
        if verdict[:1] != auth.ACCEPTED:
            return {"challenge": challenge, "verdict": verdict, "nonce": nonce, "response": response}
        session_key = auth.session_key(key, nonce, response)
        sent = seal(session_key, sealed.CLIENT, request_bytes(method, params))
        raw.sendall(sent)
        received = b""
        while whole_frames(open_records(session_key, sealed._TO_CLIENT, received)) < 2:
            chunk = raw.recv(1 << 16)
            if not chunk:
                break
            received += chunk
    return {"challenge": challenge, "verdict": verdict, "nonce": nonce, "response": response,
            "session_key": session_key, "sent": sent, "received": received}  # fmt: skip


def seal(session_key: bytes, side: str, data: bytes) -> bytes:
    """`data` as the sealed records `side` puts on the wire (through a real SealedSocket)."""
    a, b = socket.socketpair()
    sender = sealed.SealedSocket(a, session_key, side)
    try:
        sender.sendall(data)
        sender.shutdown(socket.SHUT_WR)
        out = b""
        while True:
            chunk = b.recv(1 << 16)
            if not chunk:
                return out
            out += chunk
    finally:
        sender.close()
        b.close()


def recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def write(folder: str, name: str, data: bytes) -> None:
    path = CORPUS / folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    print(f"{path.relative_to(HERE)}: {len(data)} bytes")


def capture_agent(folders: List[str]) -> None:
    from support import Target

    listen = {"PROBING_LISTEN": "127.0.0.1:0", "PROBING_TOKEN": TOKEN}
    with Target("sleeper.py", via="env", env=listen) as target:
        if "replies" in folders:
            for stem, method, params in REQUESTS:
                write("replies", f"{stem}.bin", unix_replies(target.pid, method, params))
        hello = recv_frame(unix_socket_with(target.pid, "hello"), MAX_REPLY_BYTES)
        assert hello is not None
        endpoint = hello.header["result"]["listener"]["endpoint"]
        if "endpoints" in folders:
            write("endpoints", "hello-endpoint.txt", endpoint.encode())
            for name, text in LISTEN_ADDRESSES:
                write("endpoints", f"listen-{name}.txt", text.encode())
        if "sealed" in folders or "sealed-requests" in folders or "handshake-agent" in folders:
            for stem, method, params in REQUESTS[:8]:
                session = tcp_session(endpoint, TOKEN, method, params)
                if "sealed" in folders:
                    write("sealed", f"{stem}.bin", session["session_key"] + session["received"])
                if "sealed-requests" in folders:
                    write("sealed-requests", f"{stem}.bin", session["session_key"] + session["sent"])
                if "handshake-agent" in folders and stem == "backtrace-plain":
                    write("handshake-agent", "accepted.bin", session["challenge"][8:] + session["response"])
        if "handshake-client" in folders:
            accepted = tcp_session(endpoint, TOKEN, "backtrace", {})
            write("handshake-client", "accepted.bin", accepted["challenge"] + accepted["verdict"])
            refused = tcp_session(endpoint, "another token, of the wrong job", "backtrace", {})
            write("handshake-client", "refused.bin", refused["challenge"] + refused["verdict"])
        if "handshake-agent" in folders:
            refused = tcp_session(endpoint, "another token, of the wrong job", "backtrace", {})
            write("handshake-agent", "refused.bin", refused["challenge"][8:] + refused["response"])
        if "pyspy" in folders:
            capture_pyspy(target.pid)


def unix_socket_with(pid: int, method: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(30)
    sock.connect(os.path.join(os.environ["PROBING_SOCKET_DIR"], f"{pid}.sock"))
    send_frame(sock, request(1, method, {}))
    return sock


def capture_pyspy(pid: int) -> None:
    from probing.outside.pyspy import py_spy

    binary = py_spy()
    assert binary is not None, "py-spy is not installed"
    for stem, extra in (("sleeper", []), ("sleeper-locals", ["--locals"]), ("sleeper-native", ["--native"])):
        result = subprocess.run([binary, "dump", "--pid", str(pid), "--json", *extra], capture_output=True)
        assert result.returncode == 0, result.stderr
        write("pyspy", f"{stem}.json", result.stdout)
    # Failures: a process that is not Python, and a PID that is no process.
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        result = subprocess.run([binary, "dump", "--pid", str(sleeper.pid), "--json"], capture_output=True)
        write("pyspy", "not-python.stderr", result.stderr)
    finally:
        sleeper.kill()
        sleeper.wait(10)
    result = subprocess.run([binary, "dump", "--pid", "999999999", "--json"], capture_output=True)
    write("pyspy", "no-process.stderr", result.stderr)
    for name in ("gil_held", "gil_held_native", "dataloader_main", "dataloader_idle_worker",
                 "dataloader_stuck_worker"):  # fmt: skip
        shutil.copy(TESTS / "unit" / "data" / f"pyspy_{name}.json", CORPUS / "pyspy" / f"unit-{name}.json")


def reader_output(core: Path, locals: bool) -> bytes:
    with open_core_file(str(core)) as opened:
        command = outside_core.reader_command(None, locals, confinement_arguments(opened))
        status, stdout, stderr = run_reader(command, opened, 120, outside_core.MAX_READING_BYTES)
    assert status in (0, 3), stderr
    return stdout


def capture_core() -> None:
    from support import TARGETS, Target

    with tempfile.TemporaryDirectory() as folder:
        directory = Path(folder)
        script = 'ulimit -c "$(ulimit -H -c)" && exec "$@"'
        crash = [sys.executable, str(TARGETS / "segfaults.py")]
        subprocess.run(["sh", "-c", script, "sh", *crash], cwd=directory, capture_output=True, timeout=60)
        cores = [path for path in directory.iterdir() if path.name.startswith("core")]
        if cores:
            write("core", "segfault.json", reader_output(cores[0], False))
            write("core", "segfault-locals.json", reader_output(cores[0], True))
            for core in cores:
                core.unlink()
        else:
            print("no kernel core was written (core_pattern, ulimit -c): segfault seeds skipped")
        if shutil.which("gcore"):
            with Target("sleeper.py", via="plain") as target:
                subprocess.run(["gcore", "-o", str(directory / "gcore"), str(target.pid)],
                               capture_output=True, timeout=120, check=True)  # fmt: skip
            write("core", "gcore-sleeper-locals.json", reader_output(directory / f"gcore.{target.pid}", True))
            (directory / f"gcore.{target.pid}").unlink()
            sleeper = subprocess.Popen(["sleep", "60"])
            try:
                subprocess.run(["gcore", "-o", str(directory / "gcore"), str(sleeper.pid)],
                               capture_output=True, timeout=120, check=True)  # fmt: skip
            finally:
                sleeper.kill()
                sleeper.wait(10)
            write("core", "not-python.json", reader_output(directory / f"gcore.{sleeper.pid}", False))
        # A file that is no core, given to the reader on descriptor 3 as the CLI gives a core.
        not_a_core = 'exec "$0" -I "$1" /proc/self/fd/3 3<"$2"'
        result = subprocess.run(["sh", "-c", not_a_core, sys.executable, outside_core.READER, __file__],
                                capture_output=True, timeout=60)  # fmt: skip
        write("core", "not-a-core.json", result.stdout)
    captured_once = TESTS / "unit" / "data" / "pystack_core_segfault.json"
    shutil.copy(captured_once, CORPUS / "core" / "unit-segfault.json")


def main(argv: List[str]) -> int:
    folders = argv or ["replies", "sealed", "sealed-requests", "handshake-client", "handshake-agent",
                       "pyspy", "core", "endpoints"]  # fmt: skip
    sockets: Optional[str] = None
    if "PROBING_SOCKET_DIR" not in os.environ:
        sockets = tempfile.mkdtemp(prefix="probing-capture-")
        os.environ["PROBING_SOCKET_DIR"] = sockets
    try:
        if set(folders) - {"core"}:
            capture_agent(folders)
        if "core" in folders:
            capture_core()
    finally:
        if sockets is not None:
            shutil.rmtree(sockets, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
