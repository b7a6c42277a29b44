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
"""

from __future__ import annotations

import builtins
import sys
from typing import Any

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


class SessionNamespace(dict):  # type: ignore[type-arg]
    """The session's globals; names it does not hold are read from the live __main__."""

    def __init__(self) -> None:
        super().__init__(__name__="__main__", __builtins__=BuiltinsOfSession(self))

    def __missing__(self, name: str) -> Any:
        return _from_main(name)


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

    def __missing__(self, name: str) -> Any:
        return _from_main(name)


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
