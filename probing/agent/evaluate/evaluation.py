"""eval: run the user's code in the live `__main__` namespace (or a frame's), in its own thread.

The code runs in a worker thread so that the connection thread can enforce the timeout:
on expiry it raises EvalTimeout in the worker with PyThreadState_SetAsyncExc, which stops a
`while True: pass` at its next bytecode (a blocking C call is interrupted when it returns).
Code that catches the interrupt and carries on is interrupted again, every
REINTERRUPT_EVERY_S for KEEP_INTERRUPTING_S after the reply (detach stops that), and the reply
says it catches them. Process-ending calls are refused in the worker (exitguard.py) unless
the request allows them.

What the code printed, its value and its traceback travel in the reply's payload, not in its
JSON header (which is capped): each is cut at MAX_TEXT_CHARS with a line saying how much was
dropped, so a large output arrives, or arrives cut, and is never lost with the whole reply.
"""

from __future__ import annotations

import ast
import itertools
import sys
import traceback
from types import CodeType
from typing import Any, Dict, List, Optional, Tuple

from ...originals import Event, allocate_lock, get_ident, monotonic, perf_counter
from ..lifecycle import WORK, on_stop
from ..output import CaptureBuffer, captured, release
from ..requests import ErrorKind, RequestError
from ..threads import AgentThread, forget_dummy
from . import exitguard
from .framenames import AmbiguousName, FrameNames, frames_for
from .frames import frame_namespace
from .interrupts import Interruptible
from .namespace import EvalNamespace

# How long the request waits, past its timeout, for interrupted code to end.
INTERRUPT_GRACE_S = 1.0
# Code that catches the interrupt gets another this often, for this long after the reply.
REINTERRUPT_EVERY_S = 0.1
KEEP_INTERRUPTING_S = 30.0
# The longest timeout a request may ask for (a day): a float that big is a typo or an attack.
MAX_TIMEOUT_S = 86400.0
# What a reply carries of one text (value repr, stdout, stderr, traceback); the rest is
# counted and said. Output capture (output.py) cuts at its own, equal, cap first.
MAX_TEXT_CHARS = 4 << 20
# The message in an error reply's header (the whole text is in the traceback).
MAX_MESSAGE_CHARS = 2000
_counter = itertools.count(1)
# Interrupts that reached a handler in each eval thread: the difference between code blocked
# in C (none landed) and code that catches them and carries on (some did).
_landed: Dict[int, int] = {}
# Set on detach: the threads that keep interrupting stubborn code stop.
_stopping = Event()
_reinterrupters: List[AgentThread] = []
_reinterrupters_lock = allocate_lock()


class EvalTimeout(BaseException):
    """Raised in an eval whose time is up; a BaseException, so `except Exception` lets it by."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        # Instantiated in the eval thread, when the interrupt reaches a handler there.
        ident = get_ident()
        _landed[ident] = _landed.get(ident, 0) + 1


def cut(text: Optional[str], limit: int, what: str) -> Optional[str]:
    """`text` cut to `limit` characters, with a line saying how many were dropped."""
    if text is None or len(text) <= limit:
        return text
    return f"{text[:limit]}\n[probing: {len(text) - limit} more characters of {what} were dropped]\n"


def _rstrip_newline(text: Optional[str]) -> Optional[str]:
    return text[:-1] if text is not None and text.endswith("]\n") else text


def compile_source(source: str, filename: str) -> Tuple[Optional[CodeType], Optional[CodeType]]:
    """Split code like the REPL does: statements to exec, and a final expression to show."""
    tree = ast.parse(source, filename, "exec")
    tail = None
    last = tree.body[-1] if tree.body else None
    if isinstance(last, ast.Expr):
        tree.body.pop()
        tail = compile(ast.Expression(last.value), filename, "eval")
    body = compile(tree, filename, "exec") if tree.body else None
    return body, tail


def _format_exception(error: BaseException, filename: str, source: str) -> str:
    import linecache

    # Let the traceback show the lines of the eval'd code, as the REPL does for <stdin>. Every
    # line ends with a newline, as a file's would: 3.11 and 3.12 count one character of the line
    # as its newline when they place the ~^~ markers, one column off on a last line without one.
    lines = [line if line.endswith("\n") else line + "\n" for line in source.splitlines(True)]
    linecache.cache[filename] = (len(source), None, lines, filename)
    try:
        tb = error.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == _THIS_FILE:
            tb = tb.tb_next  # start at the user's code, not at our exec() call
        # A refused exit ends at the user's call, not inside our guard; a NameError at the
        # user's line, not in the namespace's lookup of frames.
        shown, walk = 0, tb
        while walk is not None and walk.tb_frame.f_code.co_filename not in _TAIL_FILES:
            shown, walk = shown + 1, walk.tb_next
        return "".join(traceback.format_exception(type(error), error, tb, limit=shown or None))
    finally:
        linecache.cache.pop(filename, None)


class EvalJob(Interruptible):
    interrupt_with = EvalTimeout

    def __init__(
        self,
        own_threads: Any,
        body: Optional[CodeType],
        tail: Optional[CodeType],
        namespace: Tuple[Dict[str, Any], Any],
        filename: str,
        source: str,
        allow_exit: bool,
        frames: Optional[FrameNames] = None,
    ) -> None:
        self.own_threads = own_threads
        self.body, self.tail = body, tail
        self.globals, self.locals = namespace
        self.filename, self.source = filename, source
        self.allow_exit = allow_exit
        self.frames = frames
        self.done = Event()
        self.value: Optional[str] = None
        self.error: Optional[BaseException] = None
        self.traceback = ""
        self.out, self.err = CaptureBuffer(), CaptureBuffer()
        self.ident: Optional[int] = None
        super().__init__()

    def run(self) -> None:
        ident = get_ident()
        self.own_threads.add(ident)
        if not self.allow_exit:
            exitguard.guard(ident)
        self._run_to_the_end(ident)
        # The code may have asked threading.current_thread() (logging does): the _DummyThread
        # that made must not stay in the job's threading.enumerate().
        forget_dummy(ident)
        release(ident)
        if not self.allow_exit:
            exitguard.release(ident)
        _landed.pop(ident, None)
        self.own_threads.discard(ident)
        self.done.set()

    def _escaped(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error

    def _execute(self, ident: int) -> None:
        if self.frames is not None:
            self.frames.start(self.err.write)
        with captured(ident, self.out, self.err):
            try:
                if self.body is not None:
                    exec(self.body, self.globals, self.locals)
                if self.tail is not None:
                    value = eval(self.tail, self.globals, self.locals)
                    if value is not None:
                        self.value = repr(value)
            except BaseException as error:  # noqa: BLE001 - SystemExit too: report, don't exit
                self.error = error
                self.traceback = _format_exception(error, self.filename, self.source)
            finally:
                if isinstance(self.globals, EvalNamespace):
                    self.globals.settle()
                if self.frames is not None:
                    self.frames.close()

    def running_ident(self) -> Optional[int]:
        return self.ident

    def landed(self) -> int:
        return _landed.get(self.ident, 0) if self.ident is not None else 0


_THIS_FILE = EvalJob.run.__code__.co_filename
_GUARD_FILE = exitguard.guard.__code__.co_filename
_TAIL_FILES = {
    _GUARD_FILE,
    EvalNamespace.__missing__.__code__.co_filename,
    FrameNames.value.__code__.co_filename,
}


def _keep_interrupting(job: EvalJob, own_threads: Any, stopping: Event) -> None:
    """Interrupt code that catches the interrupt, for a bounded time, until detach."""
    ident = get_ident()
    own_threads.add(ident)
    try:
        deadline = monotonic() + KEEP_INTERRUPTING_S
        while monotonic() < deadline and not stopping.is_set() and job.interrupt():
            if job.done.wait(REINTERRUPT_EVERY_S):
                return
    finally:
        own_threads.discard(ident)
        with _reinterrupters_lock:
            _reinterrupters[:] = [thread for thread in _reinterrupters if thread.ident != ident]


def _start_reinterrupting(job: EvalJob, own_threads: Any, name: str) -> bool:
    # probing-intr-N: the OS keeps 15 bytes of a name, and the number must survive.
    thread = AgentThread(
        target=_keep_interrupting, args=(job, own_threads, _stopping), name=name.replace("eval", "intr")
    )
    with _reinterrupters_lock:
        try:
            thread.start()
        except RuntimeError:  # can't start new thread: the reply says it is not retried
            return False
        _reinterrupters.append(thread)
    return True


def stop() -> None:
    """Detach: stop interrupting, and put the real process-ending functions back."""
    global _stopping
    with _reinterrupters_lock:
        _stopping.set()
        # A fresh event for an agent attached later: this module stays imported.
        _stopping = Event()
        threads = list(_reinterrupters)
    for thread in threads:
        thread.join(timeout=1.0)
    exitguard.release_all()


def _params(params: Dict[str, Any]) -> Tuple[str, float, Optional[str], bool]:
    source = params.get("code")
    if not isinstance(source, str):
        raise RequestError(ErrorKind.BAD_REQUEST, f"eval needs a 'code' string, not {type(source).__name__}")
    timeout = params.get("timeout")
    if timeout is None:
        timeout = 10.0
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_TIMEOUT_S:
        raise RequestError(
            ErrorKind.BAD_REQUEST, f"eval 'timeout' must be a number of seconds above 0 and at most "
            f"{MAX_TIMEOUT_S:g}, not {timeout!r:.80}",
        )  # fmt: skip
    frame = params.get("frame")
    if frame is not None and (not isinstance(frame, str) or not frame):
        raise RequestError(
            ErrorKind.BAD_REQUEST, f"eval 'frame' must be a THREAD:FUNCTION string, not {frame!r:.80}"
        )
    allow_exit = params.get("allow_exit", False)
    if not isinstance(allow_exit, bool):
        raise RequestError(
            ErrorKind.BAD_REQUEST, f"eval 'allow_exit' must be true or false, not {allow_exit!r:.80}"
        )
    return source, float(timeout), frame, allow_exit


def _texts(
    job: Optional[EvalJob], traceback_text: Optional[str], notes: str = ""
) -> Tuple[Dict[str, Any], List[Any]]:
    from ...protocol.texts import encode_texts

    texts: Dict[str, Optional[str]] = {"stdout": "", "stderr": notes, "value": None}
    if job is not None:
        # The capture buffers (output.py) stop keeping output at their own cap and end it with
        # a line that says how much they dropped; the value has no such cap until here.
        texts.update(
            stdout=job.out.getvalue(), stderr=job.err.getvalue(),
            # The CLI ends a value with a newline: the note about a cut one needs none of its own.
            value=_rstrip_newline(cut(job.value, MAX_TEXT_CHARS, "the value's repr")),
        )  # fmt: skip
    if traceback_text is not None:
        texts["traceback"] = cut(traceback_text, MAX_TEXT_CHARS, "the traceback")
    return encode_texts(texts)


def _compiled(source: str, filename: str) -> Tuple[Optional[CodeType], Optional[CodeType]]:
    """The code compiled (compile_source), or the error reply a SyntaxError makes."""
    try:
        return compile_source(source, filename)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        layout, payload = _texts(None, "".join(traceback.format_exception_only(type(error), error)))
        raise RequestError(
            ErrorKind.REMOTE_ERROR,
            cut(f"{type(error).__name__}: {error}", MAX_MESSAGE_CHARS, "the message") or "",
            exception=type(error).__name__, texts=layout, payload=payload,
        ) from None  # fmt: skip


def _namespace(
    own_threads: Any, frame: Optional[str], body: Optional[CodeType], tail: Optional[CodeType]
) -> Tuple[Tuple[Any, Any], Optional[FrameNames]]:
    """(globals, locals) the code runs in: the named frame's, else `__main__`'s with the names
    the code uses that only a running frame holds (framenames.py), and those frames' names."""
    if frame:
        return frame_namespace(own_threads, frame), None
    main = sys.modules["__main__"].__dict__
    namespace: Tuple[Any, Any] = (main, main)
    try:
        frames = frames_for(own_threads, main.__contains__, (body, tail))
    except AmbiguousName as error:
        layout, payload = _texts(None, f"NameError: {error}\n", error.notes)
        raise RequestError(
            ErrorKind.REMOTE_ERROR, cut(f"NameError: {error}", MAX_MESSAGE_CHARS, "the message") or "",
            exception="NameError", texts=layout, payload=payload,
        ) from None  # fmt: skip
    if frames is not None:
        names = EvalNamespace(main, frames)
        namespace = (names, names)
    return namespace, frames


def _timed_out(job: EvalJob, own_threads: Any, name: str, timeout: float) -> RequestError:
    """The reply to code still running at its timeout, once it has been interrupted (and, if it
    carries on, handed to a thread that keeps interrupting it)."""
    deadline = monotonic() + INTERRUPT_GRACE_S
    # Repeat: code that catches BaseException and carries on gets another one.
    while not job.done.is_set() and monotonic() < deadline and job.interrupt():
        job.done.wait(REINTERRUPT_EVERY_S)
    landed = job.landed()
    if job.done.is_set():
        state = "it was interrupted"
    else:
        retrying = _start_reinterrupting(job, own_threads, name)
        more = (
            f"probing keeps interrupting it for {KEEP_INTERRUPTING_S:g} s (detach stops that)"
            if retrying
            else "probing could not go on interrupting it"
        )
        if landed:
            state = (
                f"it catches the interrupt ({landed} times so far) and keeps running in thread {name}; {more}"
            )
        else:
            state = (
                f"it is still running in thread {name} (blocked outside Python); "
                f"it will be interrupted when it returns to Python code; {more}"
            )
    layout, payload = _texts(job, None)
    return RequestError(
        ErrorKind.EVAL_TIMEOUT, f"eval did not finish within {timeout:g} s; {state}",
        interrupted=job.done.is_set(), caught_interrupts=landed, texts=layout, payload=payload,
    )  # fmt: skip


def run_eval(own_threads: Any, params: Dict[str, Any]) -> Tuple[Dict[str, Any], List[Any]]:
    """The eval method: (result, payload). Errors are RequestErrors whose details carry the
    texts' layout and `payload` (the dispatcher sends it)."""
    source, timeout, frame, allow_exit = _params(params)
    on_stop(stop, WORK)  # exit guards and interrupts outlive a request that timed out
    number = next(_counter)
    filename = f"<probing-eval-{number}>"
    body, tail = _compiled(source, filename)
    namespace, frames = _namespace(own_threads, frame, body, tail)
    job = EvalJob(own_threads, body, tail, namespace, filename, source, allow_exit, frames)
    name = f"probing-eval-{number}"
    worker = AgentThread(target=job.run, name=name)
    started = perf_counter()
    worker.start()
    job.ident = worker.ident
    if not job.done.wait(timeout):
        raise _timed_out(job, own_threads, name, timeout)
    if job.error is not None:
        raised = job.error
        message = cut(f"{type(raised).__name__}: {raised}", MAX_MESSAGE_CHARS, "the message") or ""
        layout, payload = _texts(job, job.traceback)
        raise RequestError(
            ErrorKind.REMOTE_ERROR, message, exception=type(raised).__name__,
            refused_exit=isinstance(raised, exitguard.ProcessExitRefused), texts=layout, payload=payload,
        )  # fmt: skip
    elapsed = perf_counter() - started
    layout, payload = _texts(job, None)
    return {"elapsed_s": elapsed, "texts": layout}, payload
