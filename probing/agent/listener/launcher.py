"""Whether this process is torchrun's launcher (its elastic agent), which PROBING_LISTEN must
not make listen: PROBING=1 starts an agent in every Python process of the job, the launcher's
too, and PROBING_LISTEN is meant for the ranks. With a fixed port the launcher (no LOCAL_RANK:
offset 0) would take rank 0's port; with `auto` it would open an eval-capable port nobody asked
for.

Told by the command line the kernel started the process with (/proc/self/cmdline): at the
interpreter's start-up, where autostart runs, sys.argv of `python -m torch.distributed.run`
still reads "-m", and sys.orig_argv is 3.10+. The launcher is the `torchrun` script, or the
modules torch.distributed.run and torch.distributed.launch (the deprecated one) run with -m or
by path. Neither the environment (a plain process has no RANK either) nor sys.modules (the
launcher imports torch only after autostart) tells it at start.
"""

from __future__ import annotations

import os
import sys
from typing import List, Optional

LAUNCHER_REFUSAL = "torchrun's launcher does not listen: PROBING_LISTEN is for its ranks"
_LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")
_LAUNCHER_SCRIPTS = ("torchrun",)
# Interpreter options that take a value in the next argument.
_OPTIONS_WITH_VALUE = ("-W", "-X", "-Q")


def _command_line() -> List[str]:
    try:
        with open("/proc/self/cmdline", "rb") as cmdline:
            raw = cmdline.read()
    except OSError:
        return list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])
    return [os.fsdecode(part) for part in raw.split(b"\0") if part]


def _is_launcher_path(path: str) -> bool:
    if os.path.basename(path) in _LAUNCHER_SCRIPTS:
        return True
    parts = os.path.normpath(path).split(os.sep)
    return parts[-3:] in (["torch", "distributed", "run.py"], ["torch", "distributed", "launch.py"])


def launcher_program(argv: Optional[List[str]] = None) -> Optional[str]:
    """The launcher's script or module when `argv` (default: this process's) runs one."""
    args = _command_line() if argv is None else argv
    if args and _is_launcher_path(args[0]):
        return args[0]  # a frozen or directly executed launcher
    position = 1
    while position < len(args):
        arg = args[position]
        if arg == "-m" or (arg.startswith("-m") and not arg.startswith("--")):
            module = arg[2:] or (args[position + 1] if position + 1 < len(args) else "")
            return module if module in _LAUNCHER_MODULES else None
        if arg in ("-c", "-"):
            return None  # a command or stdin: no launcher
        if arg == "--":
            position += 1
            break
        if arg in _OPTIONS_WITH_VALUE:
            position += 2
            continue
        if arg.startswith("-"):
            position += 1
            continue
        break
    script = args[position] if position < len(args) else ""
    return script if script and _is_launcher_path(script) else None
