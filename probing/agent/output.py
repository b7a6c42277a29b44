"""Per-thread capture of sys.stdout and sys.stderr for eval.

The training loop keeps printing to its terminal while an eval runs: sys.stdout is replaced
(on the first eval, never at start) by a proxy that sends a write to the capture buffer of
the writing thread if it has one and to the original stream otherwise.

A proxy, once installed, is never freed. `print()` holds only a borrowed reference to
sys.stdout while it writes (CPython's builtin_print), and our write() is Python code, so the GIL
can pass to the agent's thread in the middle of a print: had detach put the original stream
back and dropped the last reference to the proxy there, the job's print would go on writing
through freed memory (a printing job segfaulted after `eval 1; detach`, or raised
AttributeError: '_routes' from whatever object reused the memory). Retired proxies stay in
`_retired` for the life of the process and pass every write to the stream they wrapped.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Tuple

from ..originals import allocate_lock, get_ident
from .lifecycle import STREAMS, on_stop

# What one eval may print before its output is cut (the rest is counted, not kept).
MAX_CAPTURE_CHARS = 4 << 20

_stdout_routes: Dict[int, CaptureBuffer] = {}
_stderr_routes: Dict[int, CaptureBuffer] = {}
_install_lock = allocate_lock()
# Every proxy ever installed: a thread may be inside one of them long after it was replaced.
_retired: List[RoutedStream] = []


class CaptureBuffer:
    def __init__(self, limit: int = MAX_CAPTURE_CHARS) -> None:
        self.parts: List[str] = []
        self.size = 0
        self.dropped = 0
        self.limit = limit

    def write(self, text: str) -> int:
        room = self.limit - self.size
        if len(text) > room:
            self.dropped += len(text) - max(room, 0)
            text = text[: max(room, 0)]
        self.parts.append(text)
        self.size += len(text)
        return len(text)

    def getvalue(self) -> str:
        text = "".join(self.parts)
        if self.dropped:
            text += f"\n[probing: {self.dropped} more characters of output were dropped]\n"
        return text


class RoutedStream:
    """Stands in for sys.stdout/sys.stderr; everything but write() goes to the original."""

    def __init__(self, original: Any, routes: Dict[int, CaptureBuffer]) -> None:
        self._original = original
        self._routes = routes

    def write(self, text: str) -> int:
        buffer = self._routes.get(get_ident())
        if buffer is not None:
            return buffer.write(text)
        original = self._original
        return original.write(text) if original is not None else len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if get_ident() in self._routes:
            return
        original = self._original
        if original is not None:
            original.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._original, name)


def _install() -> None:
    # The job may have replaced sys.stdout since the last eval (a logger, tqdm): wrap
    # whatever is there now.
    on_stop(uninstall, STREAMS)
    with _install_lock:
        if not isinstance(sys.stdout, RoutedStream):
            sys.stdout = _keep(RoutedStream(sys.stdout, _stdout_routes))
        if not isinstance(sys.stderr, RoutedStream):
            sys.stderr = _keep(RoutedStream(sys.stderr, _stderr_routes))


def _keep(proxy: RoutedStream) -> RoutedStream:
    _retired.append(proxy)
    return proxy


def uninstall() -> None:
    """Put the original streams back, if nobody replaced our proxies since."""
    with _install_lock:
        stdout, stderr = sys.stdout, sys.stderr
        if isinstance(stdout, RoutedStream) and stdout._routes is _stdout_routes:
            sys.stdout = stdout._original
        if isinstance(stderr, RoutedStream) and stderr._routes is _stderr_routes:
            sys.stderr = stderr._original


@contextmanager
def captured(
    ident: Optional[int] = None, out: Optional[CaptureBuffer] = None, err: Optional[CaptureBuffer] = None
) -> Iterator[Tuple[CaptureBuffer, CaptureBuffer]]:
    """Capture what the current thread (or thread `ident`) writes to sys.stdout/sys.stderr,
    into new buffers or the ones given."""
    ident = get_ident() if ident is None else ident
    out = CaptureBuffer() if out is None else out
    err = CaptureBuffer() if err is None else err
    _install()
    _stdout_routes[ident] = out
    _stderr_routes[ident] = err
    try:
        yield out, err
    finally:
        _stdout_routes.pop(ident, None)
        _stderr_routes.pop(ident, None)


def release(ident: int) -> None:
    """Forget thread `ident`'s capture, had an exception cut `captured` short in it."""
    _stdout_routes.pop(ident, None)
    _stderr_routes.pop(ident, None)
