"""Flame graphs of one target: sampled stacks of every thread, from the agent, or from py-spy
when the agent cannot answer (the module hierarchy of a torch job is flame_modules.py's).

A flame graph here is a list of stacks (names root to leaf) with a weight each: samples for
sampled stacks, mean seconds per step for modules. The picture writers (cli/pictures/flame*)
take that and nothing else.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from typing import Any, Dict, List, NamedTuple, Tuple

from ...errors import (
    AgentBusy,
    AgentTimeout,
    AgentUnreachable,
    AttachFailed,
    AttachTimeout,
    NoAgent,
    PermissionDenied,
    ProbingError,
    ProcessNotFound,
)
from ...outside import spawn
from ...outside.pyspy import OutsideTimeout, outside_budget, py_spy
from ...procfs import command_line, process_alive, thread_name
from ...protocol.frames import json_loads
from ..backtrace import ask
from ..target import REMOTE_HINT, Fallback, Target, why_from_outside

# Beyond the sampling itself, what the agent may take to answer (encoding, a busy GIL).
REPLY_SLACK_S = 10.0
# What the first exchange (hello, ping) may take before the stacks are read from outside.
PING_TIMEOUT_S = 3.0
# What py-spy's raw file may weigh: folded stacks of a 10-minute record are far below it.
MAX_PYSPY_FILE_BYTES = 64 << 20


class Flame(NamedTuple):
    """What a flame graph draws: `stacks` (names root to leaf, weight), the weight's `unit`
    ("samples" or "seconds"), a `title`, notes for the user, and figures worth saying
    (samples, rate_hz, source...)."""

    stacks: List[Tuple[Tuple[str, ...], float]]
    unit: str
    title: str
    notes: List[str]
    figures: Dict[str, Any]


def short_file(path: str) -> str:
    """A file as py-spy shows it: the package path inside site-packages, else the file's name."""
    for marker in ("site-packages/", "dist-packages/"):
        at = path.rfind(marker)
        if at >= 0:
            return path[at + len(marker) :]
    return os.path.basename(path) or path


def frame_name(function: str, file: str, line: int) -> str:
    """`function (file:line)`, py-spy's default."""
    if not file:
        return function
    return f"{function} ({short_file(file)}:{line})"


def flame_from_agent_answer(answer: Any, title: str) -> Flame:
    """The agent's `sample` answer (see agent/stack_sampler.py), checked: the job names
    threads, functions and files, and a hostile one may send anything."""
    if not isinstance(answer, dict):
        raise ProbingError("the agent's stack samples are not an object")
    frames, stacks = answer.get("frames"), answer.get("stacks")
    if not isinstance(frames, list) or not isinstance(stacks, list):
        raise ProbingError("the agent's stack samples lack frames or stacks")
    names: List[str] = []
    for frame in frames:
        if not (isinstance(frame, list) and len(frame) == 3 and isinstance(frame[0], str)
                and isinstance(frame[1], str) and isinstance(frame[2], int)):  # fmt: skip
            raise ProbingError("a frame of the agent's stack samples is malformed")
        names.append(frame_name(frame[0], frame[1], frame[2]))
    counted: List[Tuple[Tuple[str, ...], float]] = []
    for stack in stacks:
        if not (isinstance(stack, list) and len(stack) == 3 and _count(stack[0])
                and isinstance(stack[1], str) and isinstance(stack[2], list)):  # fmt: skip
            raise ProbingError("a stack of the agent's stack samples is malformed")
        path = stack[2]
        if not all(isinstance(at, int) and 0 <= at < len(names) for at in path):
            raise ProbingError("a stack of the agent's stack samples names a frame it does not have")
        if stack[0] > 0:
            counted.append(((stack[1], *(names[at] for at in path)), float(stack[0])))
    notes = [str(note) for note in answer.get("notes") or [] if isinstance(note, str)]
    figures: Dict[str, Any] = {"source": "agent"}
    for key in FIGURES:
        value = answer.get(key)
        if value is None:
            continue
        if key == "samples" and not _count(value):
            raise ProbingError(f"the agent's figure 'samples' is not a count: {str(value)[:40]!r}")
        if key == "ended" and not (isinstance(value, str) and len(value) <= 64):
            raise ProbingError("the agent's figure 'ended' is not a short text")
        if key not in ("samples", "ended") and not _finite(value):
            raise ProbingError(f"the agent's figure {key!r} is not a finite number: {str(value)[:40]!r}")
        figures[key] = value
    return Flame(counted, "samples", title, notes, figures)


# What the agent's answer says of its sampling beyond the stacks, and what each must be.
FIGURES = ("samples", "rate_hz", "requested_rate_hz", "duration_s", "sampling_s", "cost_share", "ended")


def _count(value: Any) -> bool:
    """A whole number a float holds exactly (not a bool, not 10**400)."""
    return type(value) is int and 0 <= value < 2**53


def _finite(value: Any) -> bool:
    return type(value) in (int, float) and -1e15 < value < 1e15


def _sample_from_agent(target: Target, duration: float, rate: float, timeout: float) -> Flame:
    ping_wait = min(timeout, PING_TIMEOUT_S)
    if target.remote:
        client = target.connect(timeout)  # nothing to fall back on over TCP
    else:
        try:
            client = target.connect(ping_wait, attach_budget=timeout, give_up_early=True, reattach=False)
        except (AttachTimeout, AttachFailed, AgentTimeout, AgentUnreachable) as error:
            raise Fallback(error.message) from None
    with client:
        flame = sample_on(client, target, duration, rate, timeout)
    return flame


def sample_on(client: Any, target: Target, duration: float, rate: float, timeout: float) -> Flame:
    """The stacks the agent at the other end of `client` samples; Fallback when it stops
    answering (its stacks are then read from outside)."""
    ping_wait = min(timeout, PING_TIMEOUT_S)
    # A quick exchange first: an agent that cannot answer (a thread holds the GIL) is found
    # out now, by the same early look as backtrace's, not after the whole duration. (An agent
    # on another node cannot be looked at, and the first request brings its hello.)
    if not client.info or not target.remote:
        ask(client, "ping", {}, ping_wait, target)
    params = {"duration_s": duration, "rate_hz": rate}
    try:
        result, payload = client.call("sample", params, timeout=duration + timeout + REPLY_SLACK_S)
    except AgentBusy:
        raise  # another sampling runs: said as it is, not answered from outside
    except (AgentTimeout, AgentUnreachable) as error:
        raise Fallback(f"the agent stopped answering while it sampled ({error.message})") from None
    try:
        answer = json_loads(bytes(payload).decode("utf-8", "replace"))
    except ValueError:
        raise ProbingError("the agent's stack samples are not JSON") from None
    pid = target.pid or client.info.get("pid")
    command = " ".join(str(part) for part in client.info.get("argv") or [])
    flame = flame_from_agent_answer(answer, f"PID {pid}: {command}" if command else f"PID {pid}")
    flame.figures["pid"] = pid
    return flame


def sample_stacks(
    target: Target, duration: float, rate: float, timeout: float, outside: bool = False
) -> Flame:
    """Stacks of every thread sampled for `duration` seconds at up to `rate` per second: by the
    agent, or by py-spy from outside when the agent cannot answer (with a note that says why) or
    when asked (`outside`)."""
    if outside:
        if target.remote:
            raise ProbingError(f"--outside reads this machine's processes; {REMOTE_HINT}") from None
        pid = target.require_pid("--outside")
        return sample_with_pyspy(pid, duration, rate, "asked for with --outside", timeout)
    try:
        return _sample_from_agent(target, duration, rate, timeout)
    except (NoAgent, Fallback) as error:
        why = why_from_outside(target, error)

    pid = target.require_pid("sampling from outside")
    if not process_alive(pid):
        raise ProcessNotFound(f"PID {pid} exited while its stacks were sampled ({why})", hint="")
    return sample_with_pyspy(pid, duration, rate, why, timeout)


# "thread (TID): NAME" as py-spy's raw format (with --threads) begins each stack.
_THREAD_LABEL = re.compile(r"thread \((0x[0-9a-fA-F]+|\d+)\)(?:: (.*))?$", re.DOTALL)
# A frame ends in ` (file:line)`; searched from the last ` (` with no paren inside, so a long
# name full of ` (` is read in linear time, not backtracked over.
_FRAME = re.compile(r" \([^()]*:\d+\)$")


def parse_pyspy_raw(text: str) -> List[Tuple[Tuple[str, ...], float]]:
    """py-spy's raw (folded) output: `thread (TID): NAME;frame;frame COUNT` per line. A thread
    name with `;` in it is put back together; the agent's own threads are left out."""
    stacks: Dict[Tuple[str, ...], float] = {}
    for line in text.splitlines():
        body, _, count_text = line.rpartition(" ")
        if not body or not count_text.isdigit():
            continue
        parts = body.split(";")
        label = _THREAD_LABEL.match(parts[0])
        names: List[str] = parts
        if label is not None:
            rest = 1
            thread = label.group(2) or ""
            while rest < len(parts) and not _FRAME.search(parts[rest]):
                thread = f"{thread};{parts[rest]}"
                rest += 1
            tid = label.group(1)
            native_id = int(tid, 16) if tid.startswith("0x") else int(tid)
            if thread.startswith("probing-") or (thread_name(native_id) or "").startswith("probing-"):
                continue
            names = [thread or f"Thread-{native_id}", *parts[rest:]]
        key = tuple(names)
        stacks[key] = stacks.get(key, 0.0) + float(count_text)
    return list(stacks.items())


def sample_with_pyspy(pid: int, duration: float, rate: float, why: str, timeout: float) -> Flame:
    """`py-spy record` of every thread (idle ones too, as the agent counts them), parsed. py-spy
    gets the sampling's seconds and then a read from outside's share of --timeout (`timeout`) to
    start, stop and write (engine/backtrace.py: how --timeout is split)."""
    binary = py_spy()
    if binary is None:
        raise ProbingError(
            f"{why}, and py-spy is not installed to sample from outside", hint="pip install py-spy"
        )
    seconds = max(1, round(duration))
    with tempfile.TemporaryDirectory(prefix="probing-flame-") as directory:
        path = os.path.join(directory, "stacks.txt")
        command = [binary, "record", "--pid", str(pid), "--duration", str(seconds), "--rate",
                   str(max(1, round(rate))), "--format", "raw", "--nonblocking", "--threads", "--idle",
                   "-o", path]  # fmt: skip
        started = time.monotonic()
        budget = outside_budget(timeout)
        try:
            status, _, stderr = spawn.run(command, seconds + budget)
        except spawn.TimedOut:
            what = f"{why}; py-spy did not finish sampling PID {pid}"
            raise OutsideTimeout(what, budget, f" after its {seconds} s of sampling") from None
        except spawn.TooMuchOutput as too_much:
            raise ProbingError(
                f"py-spy printed more than {too_much.cap >> 20} MB on its {too_much.stream}"
            ) from None
        wall = time.monotonic() - started
        if status != 0 or not os.path.exists(path):
            raise _pyspy_failed(pid, why, stderr.decode("utf-8", "replace"), status)
        if os.path.getsize(path) > MAX_PYSPY_FILE_BYTES:
            raise ProbingError(
                f"py-spy's stacks of PID {pid} weigh more than {MAX_PYSPY_FILE_BYTES >> 20} MB"
            )
        with open(path, encoding="utf-8", errors="replace") as handle:
            stacks = parse_pyspy_raw(handle.read())
    samples = int(sum(weight for _, weight in stacks))
    argv = command_line(pid)
    command_text = " ".join(argv[1:] if argv else [])
    title = f"PID {pid}: {command_text} (sampled from outside with py-spy)"
    notes = [f"{why}; sampled from outside the process (py-spy record)"]
    figures: Dict[str, Any] = {"samples": samples, "rate_hz": round(rate, 2), "requested_rate_hz": rate,
                               "duration_s": round(wall, 3), "source": "py-spy", "pid": pid}  # fmt: skip
    return Flame(stacks, "samples", title, notes, figures)


def _pyspy_failed(pid: int, why: str, stderr: str, status: int) -> ProbingError:
    """py-spy's failure in one sentence (its `Error:` line, not its Rust backtrace)."""
    if not process_alive(pid):
        gone = f"PID {pid} exited while its stacks were sampled from outside ({why})"
        return ProcessNotFound(gone, hint="")
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    said = next((line[len("Error:") :].strip() for line in lines if line.startswith("Error:")), None)
    said = said or f"it exited with status {status}"
    if "Permission denied" in stderr or "Operation not permitted" in stderr:
        return PermissionDenied(f"{why}; py-spy is not allowed to sample PID {pid}: {said}")
    return ProbingError(f"{why}; py-spy could not sample PID {pid}: {said}")
