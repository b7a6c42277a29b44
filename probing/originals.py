"""The standard library as the agent found it: the functions it runs on, kept from before the
job could replace them.

A job may patch the modules the agent lives on after the agent started: gevent's `patch_all()`
swaps `_thread.start_new_thread`, `allocate_lock` and `get_ident`, `socket.socket`, `select.poll`
and `time.sleep` for cooperative versions; freezegun freezes `time.monotonic`; a sandbox or an
auditor wraps `socket.socket`. Code that looks these up when it runs (`time.monotonic()`,
`threading.Event()`, `socket.socket.accept`, which builds its result from the module's global
`socket`) then runs the job's replacement in an agent thread: a gevent lock blocks on a hub no
one runs, `get_ident` returns a greenlet's id that no frame table knows, a frozen clock never
reaches a deadline. So the agent and the protocol take every such function from here, and the
agent imports this module first, before any request can run. Where gevent had patched the job
before the agent loaded, the originals it saved are taken instead of its replacements.

Standard library only, Python 3.8 syntax: the agent imports it inside the target.
"""

from __future__ import annotations

import _socket
import _thread
import select
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Tuple


def _original(module: str, name: str, current: Any) -> Any:
    """What gevent replaced `module.name` with is `current`; what was there before is kept in
    gevent.monkey.saved (read, never called: no gevent code runs)."""
    monkey = sys.modules.get("gevent.monkey")
    saved = getattr(monkey, "saved", None) if monkey is not None else None
    if isinstance(saved, dict):
        entry = saved.get(module)
        if isinstance(entry, dict) and name in entry:
            return entry[name]
    return current


# Threads and locks. `_thread.RLock` and `_thread._local` are C types that gevent replaces in
# `threading` only, but they are taken the same way for a job that swapped them.
allocate_lock: Callable[[], _thread.LockType] = _original("_thread", "allocate_lock", _thread.allocate_lock)
start_new_thread: Callable[..., int] = _original("_thread", "start_new_thread", _thread.start_new_thread)
get_ident: Callable[[], int] = _original("_thread", "get_ident", _thread.get_ident)
get_native_id: Callable[[], int] = _thread.get_native_id
RLock: Any = _original("threading", "_CRLock", _thread.RLock) or _thread.RLock
local: Any = _original("_thread", "_local", _thread._local)
TIMEOUT_MAX: float = _thread.TIMEOUT_MAX

# Clocks.
monotonic: Callable[[], float] = time.monotonic
perf_counter: Callable[[], float] = time.perf_counter
wall_time: Callable[[], float] = time.time
thread_time: Callable[[], float] = time.thread_time
process_time: Callable[[], float] = time.process_time
sleep: Callable[[float], None] = _original("time", "sleep", time.sleep)

# Sockets: the C type itself. socket.socket is a Python subclass whose accept() builds its
# result from the module's global `socket`, which is what gevent and sandboxes replace.
Socket = _socket.socket
socket_timeout = _socket.timeout
getaddrinfo: Callable[..., Any] = _original("socket", "getaddrinfo", _socket.getaddrinfo)
poll: Callable[[], Any] = _original("select", "poll", select.poll)
POLLIN: int = select.POLLIN


def _json_codec() -> Tuple[Callable[[Any], str], Callable[[Any], str], Callable[[str], Any]]:
    """JSON through the C accelerator `_json` directly: compact and plain encoders, a decoder.

    Not through `json`: a job may swap json.JSONEncoder for one that serialises its own types,
    which json.dumps would then use; and `import json` drags in `re` and `enum`, ~8 ms of the
    CLI's start-up on every `probing PID backtrace` (the protocol takes its JSON from here).
    `_json` holds the same C encoder and scanner that json uses. Any interpreter where that does
    not work gets the json module. What JSON cannot hold is written as its str().
    """
    try:
        import _json

        class Options:
            strict = True
            object_hook = object_pairs_hook = None
            parse_float = parse_constant = float
            parse_int = int
            memo: Dict[Any, Any] = {}

        scan = _json.make_scanner(Options())  # type: ignore[arg-type]
        ascii_text = _json.encode_basestring_ascii
        compact = _json.make_encoder(None, str, ascii_text, None, ":", ",", False, False, True)
        plain = _json.make_encoder(None, str, ascii_text, None, ": ", ", ", False, False, True)

        def dumps_compact(value: Any) -> str:
            return "".join(compact(value, 0))

        def dumps_plain(value: Any) -> str:
            return "".join(plain(value, 0))

        def loads(text: str) -> Any:
            text = text.strip()
            try:
                value, end = scan(text, 0)
            except StopIteration:
                raise ValueError("expecting a JSON value") from None
            except (SystemError, RecursionError):
                # The scanner without json.decoder imported fails on some malformed texts with
                # a SystemError; a peer's deep nesting exhausts the stack. Both are bad input.
                raise ValueError("malformed JSON, or nested too deep") from None
            if end != len(text):
                raise ValueError(f"extra data at character {end}")
            return value

        sample = {"a": [1, 2.5, None, True, "\u00e9"]}
        if loads(dumps_compact(sample)) != sample or loads(dumps_plain(sample)) != sample:
            raise ValueError("_json round trip failed")
        return dumps_compact, dumps_plain, loads
    except Exception:  # noqa: BLE001 - any surprise: the plain module does the same job
        import json

        compact_encoder = json.JSONEncoder(separators=(",", ":"), default=str)
        plain_encoder = json.JSONEncoder(default=str)
        return compact_encoder.encode, plain_encoder.encode, json.JSONDecoder().decode


_dumps_compact, _dumps_plain, json_loads = _json_codec()


def json_dumps(value: Any, compact: bool = False) -> str:
    """json.dumps(value, default=str), ASCII; `compact`: without spaces after `,` and `:`."""
    return _dumps_compact(value) if compact else _dumps_plain(value)


class Event:
    """threading.Event on the locks above.

    threading.Event waits in a Condition that allocates its waiter locks through
    `threading._allocate_lock`, a module global gevent replaces: an agent thread waiting on one
    after `patch_all()` would wait on gevent's hub.
    """

    __slots__ = ("_flag", "_lock", "_waiters")

    def __init__(self) -> None:
        self._flag = False
        self._lock = allocate_lock()
        self._waiters: List[_thread.LockType] = []

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        with self._lock:
            self._flag = True
            waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.release()

    def clear(self) -> None:
        with self._lock:
            self._flag = False

    def wait(self, timeout: Optional[float] = None) -> bool:
        with self._lock:
            if self._flag:
                return True
            waiter = allocate_lock()
            waiter.acquire()
            self._waiters.append(waiter)
        if timeout is None:
            woken = waiter.acquire()
        else:
            woken = waiter.acquire(True, min(max(timeout, 0.0), TIMEOUT_MAX))
        if not woken:
            with self._lock:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
        return woken or self._flag
