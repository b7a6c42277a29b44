"""The ways into a process, behind one interface: `inject(pid, timeout, log) -> InjectReport`.

- ptrace (auto): native/inject.c borrows one thread that waits in a known-safe place and
  makes it dlopen the helper; only that thread stops, for about as long as dlopen takes.
- gdb: the same dlopen and call through gdb with no symbol loading (`set auto-solib-add
  off`), for platforms the injector does not support. gdb stops every thread while attached.
- pyrasite: the pyrasite package (extra `pyrasite`), for those who insist. Unsafe: it runs
  Python in the thread gdb stopped, so it hangs for as long as another thread holds the GIL,
  and a target whose gdb was killed then can crash later (DESIGN.md); it also puts its own
  directory on the target's sys.path.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, NamedTuple, Optional

from ..errors import AttachFailed, PermissionDenied, ProcessNotFound
from .tracers import describe, traced_error, tracer_of

Log = Callable[[str], None]
PACKAGE = Path(__file__).resolve().parent.parent
HELPER = PACKAGE / "_native" / "libprobing-helper.so"
INJECTOR = PACKAGE / "_native" / "probing-inject"
ATTACH_SCRIPT = PACKAGE / "bootstrap" / "attach.py"
# An injected dlopen that has started is waited for to its end (see native/inject.c).
_CALL_GRACE_S = 65.0


class InjectReport(NamedTuple):
    method: str
    thread: Any  # the OS thread id borrowed, or a description
    where: str  # what that thread was doing
    stopped_ms: float  # how long the longest-stopped thread was held
    stopped_total_ms: float
    command: str  # what was run, for -v and bug reports


def native(path: Path) -> str:
    if not path.exists():
        raise AttachFailed(
            f"probing was installed without its native helper ({path.name} is missing)",
            hint="reinstall probing where a C compiler is available (it builds native/ at install)",
        )
    return str(path)


def ptrace_hint(pid: int) -> str:
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as scope_file:
            scope = scope_file.read().strip()
    except OSError:
        scope = None
    advice = []
    if scope == "3":
        advice.append("kernel.yama.ptrace_scope is 3: ptrace is disabled until reboot")
    elif scope in ("1", "2"):
        advice.append(
            f"kernel.yama.ptrace_scope is {scope}: run probing as root (or with CAP_SYS_PTRACE), "
            "or `sudo sysctl kernel.yama.ptrace_scope=0`"
        )
    advice.append("in a container, start it with `docker run --cap-add=SYS_PTRACE`")
    advice.append("or start the job with the agent: `probing run -- python train.py`")
    return "; ".join(advice)


def _run(command: List[str], timeout: float, log: Log) -> subprocess.CompletedProcess[str]:
    log("running: " + shlex.join(command))
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        output = (
            (expired.stdout or b"").decode() if isinstance(expired.stdout, bytes) else expired.stdout or ""
        )
        raise AttachFailed(
            f"{Path(command[0]).name} did not finish within {timeout:g} s: {output.strip()}"
        ) from None


def _symbols(pid: int, helper: str, log: Log) -> Dict[str, Any]:
    return _reply(_run([native(INJECTOR), "--symbols", str(pid), helper], 10, log), pid)


def _refuse_if_traced(pid: int) -> None:
    """gdb and pyrasite attach to every thread: any thread another tracer holds stops them."""
    tracer = tracer_of(pid)
    if tracer is not None:
        raise traced_error(pid, tracer)


def _reply(result: subprocess.CompletedProcess[str], pid: int) -> Dict[str, Any]:
    lines = result.stdout.strip().splitlines()
    try:
        reply: Dict[str, Any] = json.loads(lines[-1])
    except (IndexError, ValueError):
        raise AttachFailed(
            f"probing-inject failed: {result.stderr.strip() or result.stdout.strip()}"
        ) from None
    if reply.get("ok"):
        return reply
    kind, message = reply.get("error"), reply.get("message", "")
    if kind == "traced" and isinstance(reply.get("tracer"), int):
        raise traced_error(pid, describe(reply["tracer"]))
    if kind == "permission":
        _refuse_if_traced(pid)  # a tracer that came between the injector's look and ours
        raise PermissionDenied(f"not allowed to ptrace PID {pid}: {message}", hint=ptrace_hint(pid))
    if kind == "exited":
        raise ProcessNotFound(f"PID {pid} exited during the attach")
    if kind == "unsupported_platform":
        raise AttachFailed(message, hint="use --method gdb")
    if kind == "no_safe_moment":
        raise AttachFailed(message, hint="retry, or use --method gdb, which stops the whole process")
    if kind in ("no_libc_file", "no_dlopen"):
        raise AttachFailed(
            f"attach failed: {message}",
            hint="start the job with the agent instead: `probing run -- python train.py`; "
            "`probing -v PID ...` shows the injector's command line",
        )
    raise AttachFailed(f"attach failed: {message}")


class PtraceMethod:
    name = "ptrace"

    def inject(self, pid: int, timeout: float, log: Log, helper: str, helper_in_target: str) -> InjectReport:
        command = [native(INJECTOR), "-v", "--timeout-ms", str(int(timeout * 1000))]
        if helper_in_target != helper:
            command += ["--dlopen-path", helper_in_target]
        command += [str(pid), helper]
        result = _run(command, timeout + _CALL_GRACE_S, log)
        for line in result.stderr.splitlines():
            log(line)
        reply = _reply(result, pid)
        return InjectReport(
            "ptrace",
            reply["tid"],
            reply["where"],
            reply["stopped_ms"],
            reply["stopped_total_ms"],
            shlex.join(command),
        )


def _poke_string(address: str, text: str) -> List[str]:
    """gdb commands writing `text` (NUL-terminated) at `address`, 8 bytes at a time."""
    data = os.fsencode(text) + b"\0"
    data += b"\0" * (-len(data) % 8)
    words = [int.from_bytes(data[offset : offset + 8], "little") for offset in range(0, len(data), 8)]
    return [f"set *(unsigned long *)({address} + {8 * index}) = {word}" for index, word in enumerate(words)]


def gdb_breaks_registers(gdb: str, log: Log) -> Optional[str]:
    """What goes wrong when this gdb calls a function in a process, tried on a `sleep` of our
    own; None when the call works and the registers come back.

    Some gdb and kernel pairs cannot write a thread's extended register state back after a
    call (gdb 13.1 on Linux 6.18: "Couldn't write extended state status: Bad address"): the
    thread then resumes with the wrong registers (the test `sleep` died saying "cannot read
    realtime clock"). The gdb and pyrasite methods try it on a throwaway process first rather
    than on the job.
    """
    sleeper = shutil.which("sleep")
    if sleeper is None:
        return None
    victim = subprocess.Popen([sleeper, "60"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        command = [gdb, "-nx", "-batch", "-iex", "set auto-solib-add off", "-p", str(victim.pid),
                   "-ex", "call (int)getpid()"]  # fmt: skip
        try:
            result = _run(command, 20.0, log)
        except AttachFailed as error:
            return error.message
        output = result.stdout + result.stderr
        for line in output.splitlines():
            if line.startswith("Couldn't write") or line.startswith("Couldn't read"):
                return line.strip()
        if f"= {victim.pid}" not in output:
            return output.strip().splitlines()[-1] if output.strip() else "gdb printed nothing"
        return None
    finally:
        victim.kill()
        victim.wait()


def _refuse_broken_gdb(method: str, log: Log) -> None:
    gdb = shutil.which("gdb")
    problem = gdb_breaks_registers(gdb, log) if gdb is not None else None
    if problem is not None:
        raise AttachFailed(
            f"gdb on this machine cannot call a function in a process without breaking its thread "
            f"(tried on a process of probing's own: {problem}); the {method} method would leave "
            "the job's thread with the wrong registers, so it was not used",
            hint="use the default method (--method ptrace), which saves and restores every register itself",
        )


class GdbMethod:
    name = "gdb"

    def inject(self, pid: int, timeout: float, log: Log, helper: str, helper_in_target: str) -> InjectReport:
        gdb = shutil.which("gdb")
        if gdb is None:
            raise AttachFailed("gdb is not installed", hint="apt-get install gdb, or use --method ptrace")
        _refuse_if_traced(pid)
        _refuse_broken_gdb("gdb", log)
        symbols = _symbols(pid, helper, log)
        mode = 2 | (0x80000000 if symbols["dlopen_is_private"] else 0)
        # No symbols are loaded (libtorch alone has hundreds of MB): every address is given.
        # The helper's path goes below the stack pointer of the thread gdb stopped in.
        commands = [
            "set $path = (unsigned long)$sp - 8192",
            *_poke_string("$path", helper_in_target),
            f"set $handle = ((void *(*)(char *, int)){symbols['dlopen']})((char *)$path, {mode})",
            'printf "handle=%lu\\n", (unsigned long)$handle',
            f"set $started = ((int (*)(void))(*(unsigned long *)$handle + {symbols['start_offset']}))()",
            'printf "started=%d\\n", $started',
        ]
        # -iex runs before the attach: with plain -ex, gdb would load every library's symbols
        # while attaching (seconds for libtorch) before reading `set auto-solib-add off`.
        settings = ["set auto-solib-add off", "set confirm off", "set pagination off"]
        command = [
            gdb, "-nx", "-batch",
            *[part for setting in settings for part in ("-iex", setting)],
            "-p", str(pid),
            *[part for c in commands for part in ("-ex", c)],
        ]  # fmt: skip
        began = time.monotonic()
        result = _run(command, timeout + _CALL_GRACE_S, log)
        stopped_ms = (time.monotonic() - began) * 1000
        for line in (result.stdout + result.stderr).splitlines():
            log("gdb: " + line)
        if "ptrace: Operation not permitted" in result.stderr:
            _refuse_if_traced(pid)
            raise PermissionDenied(f"not allowed to ptrace PID {pid}", hint=ptrace_hint(pid))
        if "started=0" not in result.stdout or "handle=0\n" in result.stdout:
            raise AttachFailed(
                f"gdb could not load the helper: {result.stderr.strip() or result.stdout.strip()}"
            )
        # gdb holds every thread from its attach to its detach: its run time is the bound.
        return InjectReport(
            "gdb", "all threads", "stopped by gdb", stopped_ms, stopped_ms, shlex.join(command)
        )


class PyrasiteMethod:
    name = "pyrasite"

    def inject(self, pid: int, timeout: float, log: Log, helper: str, helper_in_target: str) -> InjectReport:
        if helper != helper_in_target:
            raise AttachFailed("pyrasite cannot attach into a container", hint="use --method ptrace")
        try:
            import pyrasite  # type: ignore[import-untyped]  # noqa: F401
        except ImportError:
            raise AttachFailed(
                "pyrasite is not installed", hint="pip install 'probing[pyrasite]', or use --method ptrace"
            ) from None
        _refuse_if_traced(pid)
        _refuse_broken_gdb("pyrasite", log)  # pyrasite drives gdb
        import tempfile  # only here: its import costs every attach a few ms

        with tempfile.TemporaryDirectory() as scratch:
            # pyrasite execs a file in __main__'s namespace: hand it one that runs attach.py
            # in a namespace of its own, on the job's thread that gdb stopped (which goes on).
            payload = Path(scratch) / "probing_payload.py"
            script = str(ATTACH_SCRIPT)
            payload.write_text(
                f"exec(compile(open({script!r}).read(), {script!r}, 'exec'), "
                f"{{'__name__': '__probing_attach__', '__file__': {script!r}, "
                f"'_PROBING_ON_A_JOB_THREAD': True}})\n"
            )
            os.chmod(scratch, 0o755)
            code = "import pyrasite, sys; pyrasite.inject(int(sys.argv[1]), sys.argv[2], verbose=True)"
            command = [sys.executable, "-c", code, str(pid), str(payload)]
            began = time.monotonic()
            try:
                result = _run(command, timeout, log)
            except AttachFailed:
                raise AttachFailed(
                    f"pyrasite's gdb hung on PID {pid} (another thread holds the GIL) and was killed "
                    f"after {timeout:g} s; the process may crash later: the failure this method is known for",
                    hint="use --method ptrace",
                ) from None
            stopped_ms = (time.monotonic() - began) * 1000
        for line in (result.stdout + result.stderr).splitlines():
            log("pyrasite: " + line)
        if result.returncode != 0:
            raise AttachFailed(f"pyrasite failed: {result.stderr.strip()}")
        return InjectReport(
            "pyrasite", "all threads", "stopped by gdb", stopped_ms, stopped_ms, shlex.join(command)
        )


METHODS = {method.name: method for method in (PtraceMethod(), GdbMethod(), PyrasiteMethod())}


def choose_method(name: str) -> Any:
    if name == "auto":
        # os.uname() rather than platform.machine(): importing platform cost every attach ~3 ms.
        return METHODS["ptrace" if os.uname().machine in ("x86_64", "AMD64") else "gdb"]
    return METHODS[name]
