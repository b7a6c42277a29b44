"""eval: run the user's code in the live `__main__` namespace (or a frame's), in its own thread.

The code runs in a worker thread so that the connection thread can enforce the timeout:
on expiry it raises EvalTimeout in the worker with PyThreadState_SetAsyncExc, which stops a
`while True: pass` at its next bytecode (a blocking C call is interrupted when it returns).
"""

from __future__ import annotations

import ast
import itertools
import sys
import threading
import time
import traceback
from types import CodeType
from typing import Any, Dict, Optional, Tuple

from .output import captured
from .stacks import ThreadStack, thread_stacks

INTERRUPT_GRACE_S = 1.0
_counter = itertools.count(1)


class EvalTimeout(BaseException):
    """Raised in an eval whose time is up; a BaseException, so `except Exception` lets it by."""


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


def _describe_stack(stack: ThreadStack) -> str:
    names = [frame.f_code.co_name for frame in stack.frames()]
    return " > ".join(reversed(names))


def frame_namespace(own_threads: Any, spec: str) -> Tuple[Dict[str, Any], Any]:
    """Globals and locals of the innermost frame named by `THREAD:FUNCTION` (or `FUNCTION`)."""
    from .handlers import RequestError

    thread_part, _, function = spec.rpartition(":")
    if not function:
        raise RequestError("BadRequest", f"--frame {spec!r}: expected THREAD:FUNCTION")
    stacks = thread_stacks(own_threads)
    if thread_part:
        stacks = [stack for stack in stacks if stack.matches(thread_part)]
        if not stacks:
            raise RequestError("NotFound", f"no thread named or numbered {thread_part!r}")
    for stack in stacks:  # the main thread comes first
        for frame in stack.frames():
            code = frame.f_code
            if function in (code.co_name, getattr(code, "co_qualname", None)):
                return frame.f_globals, frame.f_locals
    where = "; ".join(f"{stack.name}: {_describe_stack(stack)}" for stack in stacks)
    raise RequestError("NotFound", f"no frame of function {function!r} is running ({where})")


def _format_exception(error: BaseException, filename: str, source: str) -> str:
    import linecache

    # Let the traceback show the lines of the eval'd code, as the REPL does for <stdin>.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    try:
        tb = error.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == _THIS_FILE:
            tb = tb.tb_next  # start at the user's code, not at our exec() call
        return "".join(traceback.format_exception(type(error), error, tb))
    finally:
        linecache.cache.pop(filename, None)


class EvalJob:
    def __init__(
        self,
        own_threads: Any,
        body: Optional[CodeType],
        tail: Optional[CodeType],
        namespace: Tuple[Dict[str, Any], Any],
        filename: str,
        source: str,
    ) -> None:
        self.own_threads = own_threads
        self.body, self.tail = body, tail
        self.globals, self.locals = namespace
        self.filename, self.source = filename, source
        self.done = threading.Event()
        self.value: Optional[str] = None
        self.error: Optional[BaseException] = None
        self.traceback = ""
        self.stdout = self.stderr = ""

    def run(self) -> None:
        ident = threading.get_ident()
        self.own_threads.add(ident)
        try:
            with captured(ident) as (out, err):
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
                self.stdout, self.stderr = out.getvalue(), err.getvalue()
        except BaseException as error:  # noqa: BLE001 - EvalTimeout landing outside the user's code
            if self.error is None:
                self.error = error
        finally:
            self.own_threads.discard(ident)
            self.done.set()


_THIS_FILE = EvalJob.run.__code__.co_filename


def _interrupt(ident: int) -> None:
    import ctypes

    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(EvalTimeout))


def run_eval(own_threads: Any, params: Dict[str, Any]) -> Dict[str, Any]:
    from .handlers import RequestError

    source = params.get("code")
    if not isinstance(source, str):
        raise RequestError("BadRequest", "eval needs a 'code' string")
    timeout = float(params.get("timeout") or 10.0)
    if timeout <= 0:
        raise RequestError("BadRequest", "eval timeout must be positive")
    number = next(_counter)
    filename = f"<probing-eval-{number}>"
    try:
        body, tail = compile_source(source, filename)
    except (SyntaxError, ValueError) as error:
        raise RequestError(
            "RemoteError", f"{type(error).__name__}: {error}", exception=type(error).__name__,
            traceback="".join(traceback.format_exception_only(type(error), error)),
        ) from None  # fmt: skip
    frame = params.get("frame")
    if frame:
        namespace = frame_namespace(own_threads, str(frame))
    else:
        main = sys.modules["__main__"].__dict__
        namespace = (main, main)
    job = EvalJob(own_threads, body, tail, namespace, filename, source)
    worker = threading.Thread(target=job.run, name=f"probing-eval-{number}", daemon=True)
    started = time.perf_counter()
    worker.start()
    if not job.done.wait(timeout):
        deadline = time.monotonic() + INTERRUPT_GRACE_S
        # Repeat: code that catches BaseException and carries on gets another one.
        while worker.ident is not None and not job.done.is_set() and time.monotonic() < deadline:
            _interrupt(worker.ident)
            job.done.wait(0.1)
        state = (
            "it was interrupted"
            if job.done.is_set()
            else f"it is still running in thread {worker.name} (blocked outside Python); "
            "it will be interrupted when it returns to Python code"
        )
        raise RequestError(
            "EvalTimeout", f"eval did not finish within {timeout:g} s; {state}",
            interrupted=job.done.is_set(), stdout=job.stdout, stderr=job.stderr,
        )  # fmt: skip
    if job.error is not None:
        raised = job.error
        raise RequestError(
            "RemoteError", f"{type(raised).__name__}: {raised}", exception=type(raised).__name__,
            traceback=job.traceback, stdout=job.stdout, stderr=job.stderr,
        )  # fmt: skip
    elapsed = time.perf_counter() - started
    return {"value": job.value, "stdout": job.stdout, "stderr": job.stderr, "elapsed_s": elapsed}
