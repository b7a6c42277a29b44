"""Names an eval or a repl statement reads that `__main__` lacks, found in the job's frames.

In real training code `loss`, `batch` and often `model` are locals of a training function,
not globals. When code names one that `__main__` (and the builtins) do not hold, the frames of
the job's threads are searched, never the agent's own: the main thread's innermost first, then
the other threads'. Frames of the job's own code come before frames of the standard library
and installed packages (torch's `Optimizer.step` has a `loss` local of its own): a library
frame is used only when no frame of the job's code holds the name.

Exactly one value found (several frames holding the very same object count as one): the code
runs with it, and stderr says where it came from. Different values: nothing runs, and the error
lists each with the `--frame` spelling that picks it. Nothing found: the NameError Python would
raise, with where similar names live.

Values are read with framelocals.py, which leaves the frames exactly as they were, and read
again at each use from the innermost frame that runs the same code in the same thread (a loop
reading `loss` sees the training loop's latest, and no frame is kept between reads). Nothing here runs
unless a name is missing: code naming only `__main__`'s globals never walks a stack.
"""

from __future__ import annotations

import functools
import os
import sys
from types import CodeType, FrameType
from typing import Any, Callable, Dict, Iterable, List, Optional, Set, Tuple

from ...originals import get_ident
from ..stacks import ThreadStack, current_frames, thread_stacks
from . import framelocals

_LOADS = {"LOAD_NAME", "LOAD_GLOBAL", "LOAD_FROM_DICT_OR_GLOBALS", "LOAD_CLASSDEREF"}
_STORES = {"STORE_NAME", "STORE_GLOBAL", "DELETE_NAME", "DELETE_GLOBAL"}
# How many similar names a NameError's hint offers.
MAX_SIMILAR = 3


def names_in_code(code: CodeType) -> Tuple[Set[str], Set[str]]:
    """(names the code reads from its globals, names it binds there), nested code included."""
    import dis

    loads: Set[str] = set()
    stores: Set[str] = set()
    pending = [code]
    while pending:
        current = pending.pop()
        for instruction in dis.get_instructions(current):
            if isinstance(instruction.argval, str):
                if instruction.opname in _LOADS:
                    loads.add(instruction.argval)
                elif instruction.opname in _STORES:
                    stores.add(instruction.argval)
        pending.extend(const for const in current.co_consts if isinstance(const, CodeType))
    return loads, stores


class AmbiguousName(NameError):
    """Several frames hold different values under the name: the user must pick one."""

    notes = ""  # what was said about the names resolved before this one


class Candidate:
    """One frame of one thread that holds the name."""

    def __init__(self, stack: ThreadStack, frame: FrameType, spelling: str, library: bool) -> None:
        self.stack = stack
        self.frame = frame
        self.spelling = spelling  # THREAD:FUNCTION for --frame
        self.library = library

    def where(self) -> str:
        code = self.frame.f_code
        place = f"{os.path.basename(code.co_filename)}:{self.frame.f_lineno}, {self.stack.name}"
        if not code.co_flags & framelocals.CO_OPTIMIZED:
            return f"name in {code.co_name} at {place}"
        return f"local of {code.co_name}() at {place}"


@functools.lru_cache(maxsize=None)
def _library_directories() -> Tuple[str, ...]:
    import site
    import sysconfig

    paths = sysconfig.get_paths()
    found = [paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths]
    found += list(getattr(site, "getsitepackages", lambda: [])())
    found.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the agent's own
    return tuple(os.path.join(os.path.realpath(path), "") for path in found)


@functools.lru_cache(maxsize=4096)
def is_library(filename: str) -> bool:
    """Whether a frame's file is the standard library's, an installed package's or probing's."""
    if filename.startswith("<"):
        return True  # <frozen importlib._bootstrap>, <string>
    return os.path.realpath(filename).startswith(_library_directories())


def _spelling(stack: ThreadStack, stacks: List[ThreadStack], frame: FrameType) -> str:
    import shlex

    same_name = sum(1 for other in stacks if other.name == stack.name)
    thread = stack.name if same_name == 1 else str(stack.ident)
    return shlex.quote(f"{thread}:{frame.f_code.co_name}")


def frames_holding(own_threads: Any, name: str, bound: bool = True, library: bool = True) -> List[Candidate]:
    """Frames of the job's threads whose code has `name` (bound to a value now, if `bound`):
    main thread first, innermost first; library frames only where the job's code has none
    (or never, when `library` is false)."""
    stacks = thread_stacks(own_threads)
    main = getattr(sys.modules.get("__main__"), "__dict__", None)
    found: List[Candidate] = []
    for stack in stacks:
        for frame in stack.frames():
            if frame.f_globals is main and frame.f_code.co_name == "<module>":
                continue  # __main__'s own namespace, already looked in
            if not framelocals.declares(frame, name):
                continue
            if bound and not framelocals.read(frame, name)[0]:
                continue
            spelling = _spelling(stack, stacks, frame)
            found.append(Candidate(stack, frame, spelling, is_library(frame.f_code.co_filename)))
    own = [candidate for candidate in found if not candidate.library]
    return own or (found if library else [])


def describe_choices(name: str, candidates: List[Candidate], before_running: bool) -> str:
    ran = "nothing ran. Pick" if before_running else "pick"
    lines = [
        f"name {name!r} is not in __main__, and {len(candidates)} frames hold different values under it; "
        f"{ran} one with --frame:"
    ]
    for candidate in candidates:
        lines.append(f"  {name}: {candidate.where()}   --frame {candidate.spelling}")
    return "\n".join(lines)


def similar_names(own_threads: Any, name: str, main_names: Iterable[str]) -> str:
    """Where names like `name` live (__main__, the builtins, the frames' locals); '' if none."""
    import builtins
    import difflib

    places: Dict[str, str] = {}
    for candidate_name in list(main_names):
        places.setdefault(str(candidate_name), "in __main__")
    for candidate_name in builtins.__dict__:
        places.setdefault(candidate_name, "a builtin")
    for stack in thread_stacks(own_threads):
        for frame in stack.frames():
            if is_library(frame.f_code.co_filename):
                continue
            where = Candidate(stack, frame, "", False).where()
            for local in framelocals.local_names(frame):
                places.setdefault(local, where)
    close = difflib.get_close_matches(name, list(places), n=MAX_SIMILAR, cutoff=0.7)
    return ", ".join(f"{match!r} ({places[match]})" for match in close)


def frames_for(
    own_threads: Any,
    present: Callable[[str], bool],
    codes: Iterable[Optional[CodeType]],
    for_new_names: bool = False,
) -> Optional[FrameNames]:
    """The job's frames, for code that names something neither `present` nor the builtins hold
    (None: the code runs as it always did, and no stack is walked). A name the code only reads
    that several frames hold with different values raises AmbiguousName before anything runs.
    `for_new_names`: also for code that binds a name `present` lacks (the repl, which says when
    a session's name hides a frame's)."""
    import builtins

    loads: Set[str] = set()
    stores: Set[str] = set()
    for code in codes:
        if code is not None:
            read, bound = names_in_code(code)
            loads |= read
            stores |= bound
    absent = {name for name in loads if not present(name) and name not in builtins.__dict__}
    # A name the code binds itself (`x = 1; print(x)`, a `global` a function it defines sets)
    # needs no frame unless one holds it: such code runs in __main__ as any eval always did,
    # where a function's `global` reaches __main__ (in an EvalNamespace it would not).
    if not any(name not in stores or _held_by_a_frame(own_threads, name) for name in absent):
        if not for_new_names or all(present(name) for name in stores):
            return None
    frames = FrameNames(own_threads)
    frames.new_names = {name for name in stores if not present(name)}
    try:
        frames.check(absent - stores)
    except AmbiguousName as error:
        error.notes = "".join(frames.pending)
        frames.close()
        raise
    return frames


def _held_by_a_frame(own_threads: Any, name: str) -> bool:
    return framelocals.can_read() and bool(frames_holding(own_threads, name))


class Binding:
    """A name read from a frame: which thread and which code, not the frame itself. Each use
    finds that code's innermost frame in that thread again: a per-step function's `loss` reads
    the running step's, and a step that returned is not kept alive (with all its locals) by an
    eval that read it once."""

    def __init__(self, candidate: Candidate) -> None:
        self.ident = candidate.stack.ident
        self.code = candidate.frame.f_code
        self.where = candidate.where()

    def read(self, name: str) -> Tuple[bool, Any]:
        """(found, value) in the innermost frame of the code in the thread; (False, None) when
        the thread no longer runs it."""
        frame: Optional[FrameType] = current_frames().get(self.ident)
        while frame is not None and frame.f_code is not self.code:
            frame = frame.f_back
        if frame is None:
            return False, None
        return framelocals.read(frame, name)


class FrameNames:
    """The frames one eval or repl statement reads names from; set up before it runs and
    closed when it ends (it holds frames, which hold their locals)."""

    def __init__(self, own_threads: Any) -> None:
        self.own_threads = own_threads
        # Where notes go (the code's stderr); kept until the code's output exists.
        self.report: Optional[Callable[[str], Any]] = None
        self.pending: List[str] = []
        self.bindings: Dict[str, Binding] = {}
        self.kept: Set[str] = set()
        self.new_names: Set[str] = set()  # names the code binds that nothing held before it
        self.ident: Optional[int] = None  # the thread the code runs in; set when it starts
        self.closed = False

    def say(self, text: str) -> None:
        if self.report is None:
            self.pending.append(text)
        else:
            self.report(text)

    def start(self, report: Callable[[str], Any]) -> None:
        """The code starts in the calling thread; notes go to `report` from now on."""
        self.ident = get_ident()
        self.report = report
        for text in self.pending:
            report(text)
        self.pending = []

    def assigned(self, names: Dict[str, Any], main: Dict[str, Any]) -> None:
        """The repl: names (and values) the statement bound in the session that hide a frame's
        from now on."""
        for name, value in names.items():
            binding = self.bindings.get(name)
            if binding is not None:
                hidden: Optional[str] = binding.where
                said = f"probing: {name}: assigned after it was read from a frame; the session's value"
            elif name not in main:
                hidden = self._hidden_by(name, value)
                said = f"probing: {name}: the session's value"
            else:
                continue
            if hidden is not None:
                self.say(
                    f"{said} now hides the {hidden} (`del {name}` shows it again; the frame is unchanged)\n"
                )

    def active(self) -> bool:
        """Frames are searched only from the code's own thread while it runs: a function it
        defined and the job calls later reads __main__ only."""
        return not self.closed and self.ident == get_ident()

    def _bind(self, name: str, before_running: bool = False) -> Optional[Binding]:
        binding = self.bindings.get(name)
        if binding is not None:
            return binding
        if not framelocals.can_read():
            return None
        candidates = frames_holding(self.own_threads, name)
        if not candidates:
            return None
        values = {id(framelocals.read(candidate.frame, name)[1]) for candidate in candidates}
        if len(values) > 1:
            raise AmbiguousName(describe_choices(name, candidates, before_running))
        binding = self.bindings[name] = Binding(candidates[0])
        if len(candidates) > 1:
            more = len(candidates) - 1
            binding.where += f" (the same object in {more} more frame{'s' * (more > 1)})"
        self.say(f"probing: {name}: {binding.where}\n")
        return binding

    def check(self, names: Iterable[str]) -> None:
        """Before the code runs: each name it only reads resolves to at most one value."""
        for name in sorted(names):
            self._bind(name, before_running=True)

    def value(self, name: str) -> Any:
        """The value of `name` in its frame; KeyError when no frame holds it."""
        binding = self._bind(name)
        if binding is None:
            raise KeyError(name)
        found, value = binding.read(name)
        if not found:
            # The function returned (or the name was deleted there): look again, once.
            del self.bindings[name]
            binding = self._bind(name)
            found, value = binding.read(name) if binding is not None else (False, None)
        if not found:
            raise KeyError(name)
        return value

    def keeps(self, name: str, value: Any, main: Dict[str, Any]) -> bool:
        """Whether an assignment to `name` stays in the eval rather than going to __main__:
        when the name was read from a frame, or __main__ lacks it and a frame of the job's code
        holds another object under it (in __main__ it would hide that from every later eval; an
        import of the module the frame holds too hides nothing). Says so on stderr."""
        if name in self.kept:
            return True
        binding = self.bindings.get(name)
        if binding is not None:
            self.kept.add(name)
            self.say(
                f"probing: {name}: assigned after it was read from a frame; the new value stays in "
                f"this eval (the {binding.where} is unchanged)\n"
            )
            return True
        if name in main:
            return False
        hidden = self._hidden_by(name, value)
        if hidden is None:
            return False
        self.kept.add(name)
        self.say(
            f"probing: {name}: the new value stays in this eval, not __main__, where it would hide "
            f"the {hidden} from later evals\n"
        )
        return True

    def _hidden_by(self, name: str, value: Any) -> Optional[str]:
        """Where a frame of the job's code holds another object than `value` under `name`."""
        if not framelocals.can_read():
            return None
        for candidate in frames_holding(self.own_threads, name, library=False):
            if framelocals.read(candidate.frame, name)[1] is not value:
                return candidate.where()
        return None

    def missing(self, name: str, main_names: Iterable[str]) -> NameError:
        """The NameError for a name no frame holds, with where similar names live."""
        message = f"name {name!r} is not defined"
        similar = similar_names(self.own_threads, name, main_names) if framelocals.can_read() else ""
        if similar:
            message += f". Did you mean: {similar}?"
        elif not framelocals.can_read():
            message += " (probing cannot read the frames' locals safely on this Python: use --frame)"
        return NameError(message)

    def close(self) -> None:
        self.closed = True
        self.bindings.clear()
