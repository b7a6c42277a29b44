"""A pre-auth connection flood against an agent's TCP listener, as a hostile peer would send it:
connections opened as fast as this process can (or at RATE), from one or more source
addresses in turn, none of them knowing the token. Run as a process of its own by
test_tcp_flood.py:

    python tcp_flooder.py HOST PORT SOURCE[,SOURCE...] SECONDS MAX_CONNECTS [RATE]

RATE: connects per second at most, all sources together (paced); 0 or none, as fast as it can.

Every fourth connection is one of each kind, in turn:
- silent: connects and says nothing (holds a handshake until the agent gives up on it);
- silent again (the commonest flood is a plain connect flood);
- garbage: sends a RESPONSE-sized run of random bytes at once (a wrong proof);
- trickling: sends one byte, then one more on every later round (a slowloris of the handshake).

Bounded in every way: it stops after SECONDS or MAX_CONNECTS connects, whichever comes first
(or at SIGTERM), holds at most HELD connections open (the oldest is reset to make room), and
sends to the tricklers at most once per TRICKLE_EVERY_S. It prints "ready" as it starts,
"flooding" once FLOODING_AFTER connects are out, and one JSON line at the end: how many connects
it started, over how long (the agent's own counters say how many reached it).
"""

from __future__ import annotations

import collections
import errno
import json
import os
import resource
import signal
import socket
import struct
import sys
import time
from typing import Any, Deque, Dict, List, Tuple

FLOODING_AFTER = 1000
HELD = 2000  # connections held open at once (descriptors of this process), at most
TRICKLE_EVERY_S = 0.05
KINDS = ("silent", "silent", "garbage", "trickle")
# Closed with a reset (SO_LINGER 0): no TIME_WAIT is left behind, so a long flood never runs out
# of a source address's ephemeral ports.
RESET = struct.pack("ii", 1, 0)
stopping = False


def flood(
    host: str, port: int, sources: List[str], seconds: float, max_connects: int, rate: float
) -> Dict[str, Any]:
    limit = min(HELD, _raise_descriptor_limit() - 50)
    held: Deque[Tuple[socket.socket, str]] = collections.deque()
    tricklers: List[socket.socket] = []
    started = refused_at_once = 0
    begin = time.monotonic()
    end = begin + seconds
    next_trickle = begin
    junk = os.urandom(64)
    while started < max_connects and not stopping:
        now = time.monotonic()
        if now >= end:
            break
        if rate and started > (now - begin) * rate:
            time.sleep(0.0005)
            continue
        kind = KINDS[started % len(KINDS)]
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET)
        sock.setblocking(False)
        try:
            sock.bind((sources[started // len(KINDS) % len(sources)], 0))  # every kind from each
            code = sock.connect_ex((host, port))
        except OSError:
            sock.close()
            time.sleep(0.001)  # out of ports or descriptors for a moment
            continue
        started += 1
        if started == FLOODING_AFTER:
            print("flooding", flush=True)
        if code not in (0, errno.EINPROGRESS):
            refused_at_once += 1
            sock.close()
            continue
        if kind == "garbage":
            _send(sock, junk)
        elif kind == "trickle":
            _send(sock, junk[:1])
            tricklers.append(sock)
        held.append((sock, kind))
        if len(held) > limit:
            old, old_kind = held.popleft()
            if old_kind == "trickle":
                tricklers.remove(old)
            old.close()
        if now >= next_trickle:
            next_trickle = now + TRICKLE_EVERY_S
            for trickler in tricklers:
                _send(trickler, junk[:1])
    elapsed = time.monotonic() - begin
    for sock, _ in held:
        sock.close()
    return {
        "sources": sources,
        "started": started,
        "refused_at_once": refused_at_once,
        "seconds": round(elapsed, 3),
        "rate": round(started / elapsed, 1) if elapsed > 0 else 0.0,
    }


def _raise_descriptor_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = HELD + 100 if hard == resource.RLIM_INFINITY else min(hard, HELD + 100)
    if wanted > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (OSError, ValueError):
            pass
    return soft


def _send(sock: socket.socket, data: bytes) -> None:
    try:
        sock.send(data)
    except OSError:
        pass  # not connected yet, or reset by the agent: a flooder does not care


def stop(*_: object) -> None:
    global stopping
    stopping = True


def main() -> None:
    signal.signal(signal.SIGTERM, stop)
    host, port, sources, seconds, max_connects = sys.argv[1:6]
    rate = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0
    print("ready", flush=True)
    result = flood(host, int(port), sources.split(","), float(seconds), int(max_connects), rate)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
