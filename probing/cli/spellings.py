"""What to say when a command line that probing refused is spelled as another tool spells it.

Users arrive with py-spy's and pystack's habits (`py-spy dump --pid N`, `pystack remote N`),
gdb's `-p N`, or put the command before the PID (`probing backtrace N`). Such a line is
refused by the parser anyway; this module only turns the refusal into the line that works
(`probing N backtrace`). It is asked after the parser failed, never before, so a line that
means something to probing is never read as a habit, and nothing runs on a guess.
"""

from __future__ import annotations

import os
import shlex
import stat
from typing import Dict, FrozenSet, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from ..engine.records.path import is_record_path
from ..errors import UsageError

# Global options that are flags, and those followed by a value (cli/spec.py GLOBAL_OPTIONS).
GLOBAL_FLAGS = ("-v", "--verbose", "--no-attach")
GLOBAL_VALUED = ("--attach-timeout", "--endpoints")
# How py-spy and gdb name the process to look at.
PID_OPTIONS = ("-p", "--pid")
# pystack's options of `core` that probing's has not (it reads Python frames only, and takes the
# interpreter as --exe), and those of them followed by a value.
PYSTACK_CORE_OPTIONS = ("--native", "--native-all", "--exhaustive", "--lib-search-path", "--lib-search-root")
PYSTACK_CORE_VALUED = ("--lib-search-path", "--lib-search-root")


class Commands(NamedTuple):
    """What the parser knows of probing's commands: those that act on a TARGET, each with its
    options that take a value (so that a value is not read as the TARGET)."""

    on_target: Mapping[str, FrozenSet[str]]


class Spelled(NamedTuple):
    """Another tool's words for one of ours: its name, probing's command, and its options mapped
    onto probing's (a flag of theirs onto ours, or a valued option onto ours with the value)."""

    tool: str
    command: str
    flags: Mapping[str, Sequence[str]]
    valued: Mapping[str, str]
    extra: Sequence[str] = ()  # what probing's command needs that the other tool does not


_PY_SPY_DUMP = Spelled(
    "py-spy",
    "backtrace",
    {
        "--native": ["--native"], "-n": ["--native"], "--locals": ["--locals"], "-l": ["--locals"],
        "--subprocesses": ["--children"], "-s": ["--children"], "--json": ["--format", "json"],
    },
    {},
)  # fmt: skip
_PY_SPY_RECORD = Spelled(
    "py-spy",
    "flamegraph",
    {"--subprocesses": [], "-s": []},
    {
        "-o": "-o",
        "--output": "-o",
        "-d": "--duration",
        "--duration": "--duration",
        "-r": "--rate",
        "--rate": "--rate",
    },
    ("-o", "profile.svg"),
)
_PY_SPY_TOP = Spelled("py-spy", "flamegraph", {}, {"-r": "--rate", "--rate": "--rate"}, ("-o", "cpu.html"))
_PYSTACK_REMOTE = Spelled(
    "pystack",
    "backtrace",
    {"--native": ["--native"], "--native-all": ["--native"], "--locals": ["--locals"]},
    {},
)
# The verbs of other tools that name a process, as probing's commands.
FOREIGN_VERBS: Dict[str, Spelled] = {
    "dump": _PY_SPY_DUMP,
    "record": _PY_SPY_RECORD,
    "top": _PY_SPY_TOP,
    "remote": _PYSTACK_REMOTE,
}


def foreign_spelling(args: Sequence[str], commands: Commands) -> Optional[UsageError]:
    """The error to give for a refused command line that another tool's habit explains: one
    line naming probing's spelling (`probing 5259 backtrace`); None when none does."""
    before, rest = _global_options(list(args))
    pid, after, pid_words = _pid_option(rest)
    if pid is not None:
        first = rest[0] in (*PID_OPTIONS, pid_words)  # gdb's place for it, before the command
        return _with_pid_option(before, pid, pid_words, after, commands, first)
    if not rest:
        return None
    head, tail = rest[0], rest[1:]
    if head in FOREIGN_VERBS and head not in commands.on_target:  # py-spy's `dump N`, pystack's `remote N`
        spelled = FOREIGN_VERBS[head]
        target, remaining = _first_target(tail, frozenset())
        what = f"`{head} PID` is {spelled.tool}'s spelling; probing's"
        return None if target is None else _said(what, before, target, _mapped(spelled, remaining))
    if head == "core":
        return _pystack_core(before, tail)
    if head in commands.on_target:  # `probing backtrace 5259`
        target, remaining = _first_target(tail, commands.on_target[head])
        what = "the TARGET goes before the command"
        return None if target is None else _said(what, before, target, [head, *remaining])
    verb = tail[0] if tail else ""
    if verb in FOREIGN_VERBS and verb not in commands.on_target and _looks_like_target(head):
        spelled = FOREIGN_VERBS[verb]  # `probing 5259 dump`
        what = f"`{verb}` is {spelled.tool}'s spelling; probing's"
        return _said(what, before, head, _mapped(spelled, tail[1:]))
    return None


def _with_pid_option(
    before: List[str], pid: str, pid_words: str, rest: List[str], commands: Commands, first: bool
) -> Optional[UsageError]:
    """py-spy's `dump --pid N` (and record, top), or gdb's `-p N` (`first`: before the command)."""
    head, tail = (rest[0], rest[1:]) if rest else ("backtrace", [])
    spelled = FOREIGN_VERBS.get(head)
    if spelled is not None and spelled.tool == "py-spy" and not (first and head in commands.on_target):
        what = f"`{head} {pid_words}` is py-spy's spelling; probing's"
        return _said(what, before, pid, _mapped(spelled, tail))
    if head in commands.on_target:
        return _said(f"`{pid_words}` is gdb's and py-spy's spelling; probing's", before, pid, [head, *tail])
    return None


def _said(what: str, before: List[str], target: str, words: List[str]) -> UsageError:
    line = shlex.join(["probing", *before, target, *words])
    return UsageError(f"{what}: {line}", hint="")


def _global_options(args: List[str]) -> Tuple[List[str], List[str]]:
    """probing's own global options at the front (kept in the suggestion), and what follows."""
    index = 0
    while index < len(args):
        arg = args[index]
        if arg in GLOBAL_FLAGS or any(arg.startswith(name + "=") for name in GLOBAL_VALUED):
            index += 1
        elif arg in GLOBAL_VALUED and index + 1 < len(args):
            index += 2
        else:
            break
    return args[:index], args[index:]


def _pid_option(args: List[str]) -> Tuple[Optional[str], List[str], str]:
    """The PID given as `-p N`, `--pid N` or `--pid=N` (before any `--`), the words without it,
    and how it was written."""
    for index, arg in enumerate(args):
        if arg == "--":
            break
        name, equals, value = arg.partition("=")
        if equals and name == "--pid" and value.isdigit():
            return value, args[:index] + args[index + 1 :], arg
        if arg in PID_OPTIONS and index + 1 < len(args) and args[index + 1].isdigit():
            return args[index + 1], args[:index] + args[index + 2 :], f"{arg} {args[index + 1]}"
    return None, args, ""


def _first_target(words: List[str], valued: FrozenSet[str]) -> Tuple[Optional[str], List[str]]:
    """The first word that is not an option or an option's value and names a target, and the
    words without it."""
    index = 0
    while index < len(words):
        word = words[index]
        if word == "--":
            break
        if word in valued:
            index += 2
            continue
        if not word.startswith("-") and _looks_like_target(word):
            return word, words[:index] + words[index + 1 :]
        index += 1
    return None, words


def _looks_like_target(word: str) -> bool:
    """A PID, a tcp:// endpoint, or a record file or socket that exists: what TARGET takes, and
    nothing that could be a command's own argument by accident (SQL, code, a path to write)."""
    if word.isdigit() and not word.startswith("0"):
        return True
    if word.startswith("tcp://"):
        return True
    try:
        if stat.S_ISSOCK(os.stat(word).st_mode):
            return True
    except (OSError, ValueError):
        return False
    return is_record_path(word)


def _mapped(spelled: Spelled, words: List[str]) -> List[str]:
    """probing's command with the other tool's options that have a meaning here, in probing's
    words; the others (py-spy's --nonblocking, pystack's --exhaustive) are left out."""
    mapped = [spelled.command]
    given = set()
    index = 0
    while index < len(words):
        word = words[index]
        name, equals, value = word.partition("=")
        if word in spelled.flags:
            mapped += [flag for flag in spelled.flags[word] if flag not in mapped]
        elif name in spelled.valued and (equals or index + 1 < len(words)):
            if not equals:
                index += 1
                value = words[index]
            mapped += [spelled.valued[name], value]
            given.add(spelled.valued[name])
        index += 1
    extra = list(spelled.extra)
    if extra and extra[0] not in given:
        mapped += extra
    return mapped


def _pystack_core(before: List[str], words: List[str]) -> Optional[UsageError]:
    """pystack's `core CORE [EXECUTABLE] [--native] [--locals]`: probing takes the interpreter
    as --exe, and reads the Python frames of a core only."""
    positionals: List[str] = []
    options: List[str] = []
    index = 0
    while index < len(words):
        word = words[index]
        if word in PYSTACK_CORE_VALUED:
            index += 2
            continue
        (options if word.startswith("-") else positionals).append(word)
        index += 1
    if not positionals or len(positionals) > 2 or positionals[1:] in (["backtrace"], ["query"]):
        return None
    core, executable = positionals[0], positionals[1:]
    if executable and not os.path.isfile(executable[0]):
        return None
    pystack_only = [option for option in options if option.split("=")[0] in PYSTACK_CORE_OPTIONS]
    if not executable and not pystack_only:
        return None
    line = ["probing", *before, "core", core]
    if executable:
        line += ["--exe", executable[0]]
    if "--locals" in options:
        line.append("--locals")
    what = "`core CORE EXECUTABLE`" if executable else f"`core {pystack_only[0]}`"
    return UsageError(f"{what} is pystack's spelling; probing's: {shlex.join(line)}", hint="")
