"""One statement of a repl session: compiled as the console compiles it, run in its own thread.

Compiling uses the target's own `codeop` (its Python version decides the syntax and when a
statement is complete), then recompiles the statement with its expression statements calling
the session's display function (namespace.py) instead of sys.displayhook. The statement runs
in a thread `probing-repl-N` whose output is captured per thread (output.py) into buffers a
reply empties; `interrupt` raises KeyboardInterrupt in it at its next bytecode (a blocking C
call is interrupted only when it returns to Python).
"""

from __future__ import annotations

import ast
import builtins
import importlib.util
import linecache
import sys
import traceback
from types import CodeType
from typing import Any, Dict, Optional, Set

from ...originals import Event, allocate_lock, get_ident
from ..output import CaptureBuffer, captured, release
from ..threads import AgentThread, forget_dummy
from . import exitguard
from .framenames import FrameNames
from .interrupts import Interruptible
from .namespace import DISPLAY_NAME, LeaveRepl, SessionNamespace

# Output a statement may have waiting for the client; beyond it, text is counted, not kept.
MAX_PENDING_CHARS = 4 << 20


def _future_flags() -> int:
    import __future__

    flags = 0
    for name in __future__.all_feature_names:
        flags |= getattr(__future__, name).compiler_flag
    return flags


FUTURE_FLAGS = _future_flags()


class _WarningsLeftAlone:
    """Stands in for the `warnings` module inside our copy of codeop.

    codeop's trial compiles change the process-wide warnings filters for a moment (3.8 and
    3.9: `simplefilter("error")`, later ones "ignore"): another thread of the job that warns
    at that moment would get an exception instead (torch warns from training loops). Here
    the filters are left alone; what the trial compiles warn goes to a buffer that is
    thrown away, and the final compile says it once.
    """

    def __init__(self, real: Any) -> None:
        self._real = real

    def catch_warnings(self, *args: Any, **kwargs: Any) -> Any:
        import contextlib

        return contextlib.nullcontext()

    def simplefilter(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def _private_copy(name: str, imports: Optional[Dict[str, Any]] = None) -> Any:
    """A fresh copy of standard module `name`, not in sys.modules: patching it touches nobody
    else. `imports` overrides what the copy's own import statements get."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ImportError(f"no spec for {name}")
    module = importlib.util.module_from_spec(spec)
    if imports is not None:

        def importer(wanted: str, *args: Any, **kwargs: Any) -> Any:
            if wanted in imports:
                found = imports[wanted]
                if found is None:
                    raise ImportError(f"{wanted} is not for this copy of {name}")
                return found
            return builtins.__import__(wanted, *args, **kwargs)

        module.__dict__["__builtins__"] = dict(builtins.__dict__, __import__=importer)
    spec.loader.exec_module(module)
    return module


def command_compiler() -> Any:
    """A codeop.CommandCompiler of the target's own Python, from a private copy of codeop."""
    import codeop
    import warnings

    try:
        module = _private_copy("codeop", {"warnings": _WarningsLeftAlone(warnings)})
        return module.CommandCompiler()
    except Exception:  # noqa: BLE001 - no source for codeop: the stock one still works
        return codeop.CommandCompiler()


def completer(namespace: Dict[str, Any]) -> Any:
    """An rlcompleter.Completer over `namespace`, from a private copy of rlcompleter: importing
    the real one would import readline into the job (which may write terminal set-up to its
    stdout) and replace the job's own readline completer."""
    global _rlcompleter
    if _rlcompleter is None:
        _rlcompleter = _private_copy("rlcompleter", {"readline": None})
    return _rlcompleter.Completer(namespace)


_rlcompleter: Any = None


class _ShowExpressions(ast.NodeTransformer):
    """Expression statements the console would print (outside def and class) call the session's
    display function instead of sys.displayhook, which would set `builtins._` process-wide."""

    def visit_Expr(self, node: ast.Expr) -> ast.Expr:
        function = ast.copy_location(ast.Name(id=DISPLAY_NAME, ctx=ast.Load()), node.value)
        call = ast.copy_location(ast.Call(func=function, args=[node.value], keywords=[]), node.value)
        return ast.copy_location(ast.Expr(value=call), node)

    def visit_FunctionDef(self, node: ast.AST) -> ast.AST:
        return node

    visit_AsyncFunctionDef = visit_ClassDef = visit_FunctionDef


def is_blank(source: str) -> bool:
    return all(not line.strip() or line.strip().startswith("#") for line in source.split("\n"))


def compile_statement(source: str, filename: str, flags: int) -> CodeType:
    """Compile a complete interactive statement to exec, its expressions shown by the session."""
    tree = compile(source, filename, "single", ast.PyCF_ONLY_AST | flags, True)
    body = _ShowExpressions().visit(tree).body
    module = ast.fix_missing_locations(ast.Module(body=body, type_ignores=[]))
    code: CodeType = compile(module, filename, "exec", flags, True)
    return code


class StreamBuffer(CaptureBuffer):
    """What a statement wrote to one stream that no reply has carried yet (bounded)."""

    def __init__(self, activity: Event, limit: int = MAX_PENDING_CHARS) -> None:
        super().__init__(limit)
        self._lock = allocate_lock()
        self._activity = activity

    def write(self, text: str) -> int:
        with self._lock:
            written = super().write(text)
        self._activity.set()
        return written

    def take(self) -> str:
        with self._lock:
            parts, self.parts = self.parts, []
            dropped, self.dropped = self.dropped, 0
            self.size = 0
        text = "".join(parts)
        if dropped:
            text += f"\n[probing: {dropped} characters of output were dropped: the client fell behind]\n"
        return text


class Statement(Interruptible):
    """One complete input, running in its own thread."""

    def __init__(
        self, code: CodeType, namespace: SessionNamespace, sources: Dict[str, str], own_threads: Set[int],
        number: int, owner: int, frames: Optional[FrameNames] = None,
    ) -> None:  # fmt: skip
        self.code = code
        self.namespace = namespace
        self.frames = frames  # the job's frames, when the statement names what nothing else holds
        self.sources = sources  # the session's earlier statements, for tracebacks
        self.own_threads = own_threads
        self.owner = owner  # the connection thread waiting on it
        self.activity = Event()  # set by output and by the end
        self.out = StreamBuffer(self.activity)
        self.err = StreamBuffer(self.activity)
        self.done = Event()
        self.exception: Optional[str] = None
        self.traceback = ""
        self.leave = False
        self.interrupted = False
        super().__init__()
        self.thread = AgentThread(target=self._run, name=f"probing-repl-{number}")

    def _run(self) -> None:
        ident = get_ident()
        self.own_threads.add(ident)
        self._run_to_the_end(ident)
        forget_dummy(ident)  # a threading.current_thread() of the statement's (evaluation.py)
        release(ident)
        self.own_threads.discard(ident)
        self.done.set()
        self.activity.set()

    def _execute(self, ident: int) -> None:
        # Process-ending calls are refused here as in eval (the repl has no --force).
        exitguard.guard(ident)
        try:
            self._execute_guarded(ident)
        finally:
            exitguard.release(ident)

    def _execute_guarded(self, ident: int) -> None:
        frames = self.frames
        if frames is not None:
            frames.start(self.err.write)
            self.namespace.frames = frames
        with captured(ident, self.out, self.err):
            try:
                exec(self.code, self.namespace)
            except LeaveRepl:
                self.leave = True
            except BaseException as error:  # noqa: BLE001 - SystemExit too: report it, never exit
                self.exception = type(error).__name__
                self.traceback = format_exception(error, self.sources)
            finally:
                if frames is not None:
                    if self.namespace.frames is frames:  # an abandoned statement ends after the next began
                        self.namespace.frames = None
                    namespace = self.namespace
                    bound = frames.new_names | set(frames.bindings)
                    values = {
                        name: dict.get(namespace, name)
                        for name in bound
                        if dict.__contains__(namespace, name)
                    }
                    frames.assigned(values, getattr(sys.modules.get("__main__"), "__dict__", {}))
                    frames.close()

    def running_ident(self) -> Optional[int]:
        return self.thread.ident

    def _interrupted(self) -> None:
        self.interrupted = True


def format_exception(error: BaseException, sources: Dict[str, str]) -> str:
    """The traceback as the console prints it: the session's sources shown, our frames left out."""
    shown = list(sources.items())
    for filename, source in shown:
        # Every line ends with a newline: 3.11 puts the carets one column off on a last line without.
        lines = [line if line.endswith("\n") else line + "\n" for line in source.splitlines(True)]
        linecache.cache[filename] = (len(source), None, lines, filename)
    try:
        described = traceback.TracebackException(type(error), error, error.__traceback__)
        _drop_own_frames(described, set())
        return "".join(described.format())
    finally:
        for filename, _ in shown:
            linecache.cache.pop(filename, None)


def _drop_own_frames(described: traceback.TracebackException, seen: Set[int]) -> None:
    if id(described) in seen:
        return
    seen.add(id(described))
    frames = [frame for frame in described.stack if frame.filename not in _OWN_FILES]
    described.stack = traceback.StackSummary.from_list(frames)
    chained = [described.__cause__, described.__context__, *(getattr(described, "exceptions", None) or ())]
    for other in chained:
        if other is not None:
            _drop_own_frames(other, seen)


def _own_files() -> Set[str]:
    from . import namespace

    return {
        Statement._execute.__code__.co_filename,
        namespace._Display.__call__.__code__.co_filename,
        FrameNames.value.__code__.co_filename,
    }


_OWN_FILES = _own_files()
