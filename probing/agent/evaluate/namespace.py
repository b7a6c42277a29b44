"""The namespace of a repl session: the job's live `__main__` underneath, the session's own names on top.

A session's globals are a dict of its own whose `__missing__` looks a name up in the *live*
`sys.modules['__main__'].__dict__`. For a dict subclass CPython's LOAD_NAME and LOAD_GLOBAL
take their slow path (PyObject_GetItem, hence `__missing__`), from 3.8 to 3.13. So:
- reading a name sees the job's current value (a `step` counter it updates reads fresh);
- assigning a name keeps it in the session: `model = None` never changes the job's `model`;
- functions defined in the session see session names and main's names alike (one globals).

A class body looks its names up in its own dict, then in the globals with an exact-dict
lookup that skips `__missing__`, then in `__builtins__`. So `__builtins__` is a dict of the
session too (a copy of the builtins module's dict), whose `__missing__` also looks in
`__main__`: `x = torch.zeros(1)` or `@torch.no_grad()` in a class body works as well.

That builtins dict also holds the session's display function and replaces four builtins
that would reach outside the session: `exit()`/`quit()` would close the job's stdin,
`help()` would read the job's stdin or start a pager on its terminal, `input()` would
read the job's stdin.

Names neither the session nor `__main__` nor the builtins hold are looked up in the job's
frames while a statement runs (framenames.py): `loss`, a local of the training function, reads
as it would there. EvalNamespace does the same for `eval`, whose assignments go to `__main__`.
"""

from __future__ import annotations

import builtins
import sys
from typing import Any, Dict, Optional

from .framenames import FrameNames

# The name the compiled statements call to show an expression's value (see repl.py).
DISPLAY_NAME = "__probing_display__"


class LeaveRepl(BaseException):
    """Raised by the session's exit() and quit(): the client leaves, the job runs on."""


def _from_main(name: str) -> Any:
    main = sys.modules.get("__main__")
    names = getattr(main, "__dict__", None)
    if names is None:
        raise KeyError(name)
    return names[name]


def _is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def _from_frames(frames: Optional[FrameNames], name: str, builtin_names: Dict[str, Any]) -> Any:
    """`name` from the job's frames, while the code of `frames` runs in this thread. KeyError lets
    the interpreter go on to the builtins; a name found nowhere is a NameError saying where
    similar names live. A dunder name is the interpreter's own lookup (`__annotations__` for
    an annotation) that expects KeyError when the name is absent, never a frame's local."""
    if frames is None or name in builtin_names or _is_dunder(name) or not frames.active():
        raise KeyError(name)
    try:
        return frames.value(name)
    except KeyError:
        main = sys.modules.get("__main__")
        raise frames.missing(name, list(getattr(main, "__dict__", {}))) from None


class SessionNamespace(dict):  # type: ignore[type-arg]
    """The session's globals; names it does not hold are read from the live __main__, then
    (while a statement runs) from the job's frames."""

    def __init__(self) -> None:
        self.builtins = BuiltinsOfSession(self)
        self.frames: Optional[FrameNames] = None  # those of the running statement
        super().__init__(__name__="__main__", __builtins__=self.builtins)

    def __missing__(self, name: str) -> Any:
        try:
            return _from_main(name)
        except KeyError:
            return _from_frames(self.frames, name, self.builtins)


class EvalNamespace(dict):  # type: ignore[type-arg]
    """The globals of an eval whose code names something `__main__` lacks: reads see the live
    `__main__`, then the job's frames; assignments go to `__main__` as in any eval, but for a
    name read from a frame, or one a frame of the job's code holds (in `__main__` it would hide
    the frame's value from later evals): that stays in the eval, and stderr says so."""

    def __init__(self, main: Dict[str, Any], frames: FrameNames) -> None:
        self.main = main
        self.frames = frames
        self.builtins = BuiltinsOfEval(self, main)
        dict.__setitem__(self, "__builtins__", self.builtins)
        # Read without __missing__ by class bodies and new functions (their __module__).
        dict.__setitem__(self, "__name__", main.get("__name__", "__main__"))

    def __missing__(self, name: str) -> Any:
        try:
            return self.main[name]
        except KeyError:
            return _from_frames(self.frames, name, self.builtins)

    def __setitem__(self, name: str, value: Any) -> None:
        # Names the eval keeps are found before __main__'s (a plain dict lookup comes first).
        if self.frames.active() and self.frames.keeps(name, value, self.main):
            dict.__setitem__(self, name, value)
        else:
            self.main[name] = value

    def settle(self) -> None:
        """As the eval ends, in its thread: what a `global` statement in a function it defined
        assigned (STORE_GLOBAL writes this dict itself, past __setitem__) goes to `__main__` as in
        any eval, unless the eval keeps the name."""
        for name in [name for name in dict.keys(self) if name not in ("__builtins__", "__name__")]:
            value = dict.__getitem__(self, name)
            if not self.frames.keeps(name, value, self.main):
                self.main[name] = value
                dict.__delitem__(self, name)

    def __delitem__(self, name: str) -> None:
        if dict.__contains__(self, name):
            dict.__delitem__(self, name)
        else:
            del self.main[name]


class BuiltinsOfEval(dict):  # type: ignore[type-arg]
    """An EvalNamespace's `__builtins__`: the builtins, `globals()` meaning `__main__`'s as in
    any eval, and (for class bodies) the names the eval itself sees."""

    def __init__(self, namespace: EvalNamespace, main: Dict[str, Any]) -> None:
        super().__init__(builtins.__dict__)
        self.namespace = namespace
        self["globals"] = lambda: main

    def __missing__(self, name: str) -> Any:
        return self.namespace.__missing__(name)


class BuiltinsOfSession(dict):  # type: ignore[type-arg]
    """The session's `__builtins__`: the builtins, the session's display function, and
    (for class bodies, see above) names of the live __main__."""

    def __init__(self, namespace: SessionNamespace) -> None:
        super().__init__(builtins.__dict__)
        self[DISPLAY_NAME] = _Display(namespace)
        self["exit"] = _Quitter("exit")
        self["quit"] = _Quitter("quit")
        self["help"] = _Helper()
        self["input"] = _no_input
        self.namespace = namespace

    def __missing__(self, name: str) -> Any:
        return self.namespace.__missing__(name)


class _Display:
    """sys.displayhook for one session: prints the repr to the statement's own stdout and sets
    `_` in the session, where the real hook would set `builtins._` for the whole process."""

    def __init__(self, namespace: SessionNamespace) -> None:
        self.namespace = namespace

    def __call__(self, value: Any) -> None:
        if value is None:
            return
        sys.stdout.write(repr(value) + "\n")
        self.namespace["_"] = value


class _Quitter:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Use {self.name}() or Ctrl-D to leave the repl (the job runs on)"

    def __call__(self, code: Any = None) -> None:
        raise LeaveRepl()


class _Helper:
    def __repr__(self) -> str:
        return "Type help(object) for help about object."

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        if not args and not kwargs:
            sys.stdout.write("Interactive help would read the job's stdin: type help(object) instead.\n")
            return
        import io
        import pydoc

        pydoc.Helper(input=io.StringIO(), output=sys.stdout).help(*args, **kwargs)


def _no_input(prompt: Any = "") -> str:
    raise RuntimeError("input() would read the job's own stdin; the repl cannot forward yours")
