"""The terminal side of `probing PID repl`: prompts, what statements print, notes."""

from __future__ import annotations

import os
import sys
from typing import Any, Dict

from . import inert, inert_lines

PS1 = ">>> "
PS2 = "... "


def read_line(interactive: bool, more: bool) -> str:
    """The next line: with a prompt and line editing on a terminal, as a script's otherwise."""
    if interactive:
        return input(PS2 if more else PS1)
    line = sys.stdin.readline()
    if not line:
        raise EOFError
    return line[:-1] if line.endswith("\n") else line


def end_of_input() -> None:
    """Ctrl-D at the prompt: leave the terminal on a fresh line."""
    sys.stdout.write("\n")


def after_ctrl_c() -> None:
    """A new line after the ^C the terminal echoed."""
    if sys.stdin.isatty():
        sys.stderr.write("\n")


def write_repl_banner(info: Dict[str, Any]) -> None:
    err = sys.stderr
    executable = os.path.basename(str(info.get("executable") or "python"))
    command = inert(" ".join([executable, *(str(arg) for arg in info.get("argv") or [])]))
    err.write(
        f"Python {inert(info.get('python_version'))} in PID {inert(info.get('pid'))} ({command}): "
        "names from __main__ "
        "are visible, names you assign stay in this session. Ctrl-C interrupts, Ctrl-D leaves.\n"
    )
    err.flush()


def write_repl_reply(reply: Dict[str, Any]) -> None:
    """What a statement printed since the last reply (flushed: it streams), then its traceback."""
    out, err = sys.stdout, sys.stderr
    if reply.get("stdout"):
        out.write(inert_lines(str(reply["stdout"]), out))
        out.flush()
    for text in (reply.get("stderr"), reply.get("traceback")):
        if text:
            err.write(inert_lines(str(text), err))
            err.flush()


def write_repl_keyboard_interrupt() -> None:
    err = sys.stderr
    err.write("\nKeyboardInterrupt\n")
    err.flush()


def repl_note(message: str) -> None:
    sys.stderr.write(f"probing: {inert(message)}\n")
    sys.stderr.flush()
