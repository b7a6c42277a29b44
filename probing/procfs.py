"""What /proc says about a process and its threads: the one place that parses it.

A stdlib leaf that both sides import: the agent reads its own process ("self"), the CLI the
target's. It returns facts and raises nothing of probing's own: a value that cannot be read is
None, and the few functions that must tell "gone" from "not allowed" raise the builtin
FileNotFoundError or PermissionError, which the CLI turns into ProbingErrors with their hints
(client/discovery.py). Cheap: `probing PID backtrace` calls it on every run, and the agent's
memory sampler every second.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, FrozenSet, List, Optional, Tuple, Union

    Pid = Union[int, str]  # a PID, or "self"

_LIBPYTHON = r"libpython(\d+\.\d+)[a-z]*\.so"
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _read_small(path: str) -> Optional[bytes]:
    # os.open/os.read rather than open(): the memory sampler reads these every second, and the
    # io module's objects cost more than the read itself.
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(descriptor, 4096)
    except OSError:
        return None
    finally:
        os.close(descriptor)


def _stat_fields(path: str) -> List[bytes]:
    """Fields of a stat(5) file from field 3 (state) on; [] when unreadable. The command name
    (field 2) may contain spaces and parentheses: split after the last ')'."""
    text = _read_small(path)
    if text is None:
        return []
    return text[text.rfind(b")") + 2 :].split()


def _status_value(path: str, key: bytes) -> Optional[bytes]:
    """The first word after `key` in a status(5)-like file of `key: value` lines."""
    text = _read_small_whole(path)
    if text is None:
        return None
    for line in text.splitlines():
        if line.startswith(key):
            words = line[len(key) :].split()
            return words[0] if words else None
    return None


def _read_small_whole(path: str) -> Optional[bytes]:
    # status files pass 4 KiB for processes with many groups or a long Cpus_allowed_list.
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return None


def _int(value: Optional[bytes]) -> Optional[int]:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


# --- a process ------------------------------------------------------------------------------


def process_alive(pid: int) -> bool:
    """Whether `pid` exists and has not exited (a zombie waiting to be reaped has)."""
    fields = _stat_fields(f"/proc/{pid}/stat")
    return bool(fields) and fields[0] not in (b"Z", b"X")


def effective_uid(pid: Pid) -> Optional[int]:
    value = _read_small_whole(f"/proc/{pid}/status")
    for line in (value or b"").splitlines():
        if line.startswith(b"Uid:"):
            words = line.split()
            return _int(words[2]) if len(words) > 2 else None
    return None


def file_credentials(pid: Pid) -> Optional[Tuple[int, FrozenSet[int]]]:
    """The user and groups a process opens files as (its filesystem uid and gid, and its
    supplementary groups); None when they cannot be read."""
    value = _read_small_whole(f"/proc/{pid}/status")
    uid = gid = None
    groups: List[int] = []
    for line in (value or b"").splitlines():
        words = line.split()
        if line.startswith(b"Uid:") and len(words) > 4:
            uid = _int(words[4])
        elif line.startswith(b"Gid:") and len(words) > 4:
            gid = _int(words[4])
        elif line.startswith(b"Groups:"):
            groups = [number for number in (_int(word) for word in words[1:]) if number is not None]
    if uid is None or gid is None:
        return None
    return uid, frozenset([gid, *groups])


def environ_value(pid: int, name: str) -> Optional[str]:
    """A variable of the process's start-up environment (None if unreadable or unset)."""
    data = _read_small_whole(f"/proc/{pid}/environ")
    if data is None:
        return None
    prefix = name.encode() + b"="
    for entry in data.split(b"\0"):
        if entry.startswith(prefix):
            return os.fsdecode(entry[len(prefix) :])
    return None


def environ_values(pid: int, names: Tuple[str, ...]) -> Optional[Dict[str, str]]:
    """Those of `names` set in the process's start-up environment; None when it cannot be read
    (gone, or another user's process)."""
    data = _read_small_whole(f"/proc/{pid}/environ")
    if data is None:
        return None
    wanted = {name.encode() for name in names}
    found = {}
    for entry in data.split(b"\0"):
        name, equals, value = entry.partition(b"=")
        if equals and name in wanted:
            found[os.fsdecode(name)] = os.fsdecode(value)
    return found


def parent_pid(pid: Pid) -> Optional[int]:
    fields = _stat_fields(f"/proc/{pid}/stat")
    return _int(fields[1]) if len(fields) > 1 else None


def parents() -> Dict[int, int]:
    """The parent of every process this side can see: {pid: ppid}, from /proc/*/stat (the
    kernel keeps no list of a process's children everywhere: CONFIG_PROC_CHILDREN)."""
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            parent = parent_pid(name)
            if parent is not None:
                found[int(name)] = parent
    return found


def command_line(pid: Pid) -> List[str]:
    """argv of the process; [] when unreadable (or a kernel thread)."""
    data = _read_small_whole(f"/proc/{pid}/cmdline")
    return [os.fsdecode(part) for part in (data or b"").split(b"\0") if part]


def executable(pid: Pid) -> Optional[str]:
    """The path of the program the process runs; None when /proc does not let us see it."""
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


def _version_in_executable_name(name: str) -> Optional[str]:
    """'3.11' of python3.11, python3.11d; '' for python, python3 (a Python, version unsaid);
    None for a name that is not python's. No `re`: this is on backtrace's fast path."""
    if not name.startswith("python"):
        return None
    rest = name[len("python") :].rstrip("abcdefghijklmnopqrstuvwxyz")
    major, dot, minor = rest.partition(".")
    if not rest or (major.isdigit() and not dot):
        return ""
    if major.isdigit() and minor.isdigit():
        return rest
    return None


def python_version(pid: int) -> Optional[str]:
    """'3.11' from the executable's or libpython's name; None when the process is not Python.

    Raises FileNotFoundError when the process is gone and PermissionError when /proc does not
    let us look (another user's process, or root without CAP_SYS_PTRACE).
    """
    try:
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except (FileNotFoundError, PermissionError):
        raise
    except OSError:  # a kernel thread has no executable
        return None
    exe = exe.replace(" (deleted)", "")
    named = _version_in_executable_name(exe)
    if named:
        return named
    import re  # only for an executable that does not say its version (an embedding program)

    maps = _read_small_whole(f"/proc/{pid}/maps")
    found = re.search(_LIBPYTHON, os.fsdecode(maps)) if maps is not None else None
    if found:
        return found.group(1)
    return "3" if named == "" else None


def start_ticks(pid: Pid = "self") -> Optional[int]:
    """When the process started, in clock ticks since boot: with its PID, what tells it from a
    later process given the same number (one small read, where start_time reads /proc/stat too)."""
    fields = _stat_fields(f"/proc/{pid}/stat")
    return _int(fields[19]) if len(fields) >= 20 else None


def start_time(pid: Pid = "self") -> Optional[float]:
    """Seconds since the epoch at which the process started."""
    ticks = start_ticks(pid)
    if ticks is None:
        return None
    try:
        with open("/proc/stat", "rb") as handle:
            for line in handle:
                if line.startswith(b"btime "):
                    return int(line.split()[1]) + ticks / _CLOCK_TICKS
    except (OSError, ValueError, IndexError):
        return None
    return None


def process_start_time() -> Optional[float]:
    """Seconds since the epoch at which this process started."""
    return start_time("self")


def memory_and_threads() -> Tuple[Optional[int], Optional[int], Optional[int]]:
    """(resident bytes, virtual bytes, OS threads) of this process, from one read of
    /proc/self/stat (one file, not statm as well: each read costs tens of microseconds)."""
    fields = _stat_fields("/proc/self/stat")
    if len(fields) < 22:
        return None, None, None
    # Fields 20 (num_threads), 23 (vsize, bytes) and 24 (rss, pages) of stat(5).
    return int(fields[21]) * _PAGE_SIZE, int(fields[20]), int(fields[17])


def cpu_and_resident(pid: Pid) -> Tuple[Optional[float], Optional[int]]:
    """(CPU seconds, user plus system, of all its threads so far; resident bytes) of a process,
    from one read of its stat(5)."""
    fields = _stat_fields(f"/proc/{pid}/stat")
    if len(fields) < 22:
        return None, None
    # Fields 14 (utime), 15 (stime) and 24 (rss, pages) of stat(5).
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS, int(fields[21]) * _PAGE_SIZE


def memory_bytes() -> Tuple[Optional[int], Optional[int]]:
    """(resident, virtual) bytes of this process."""
    resident, virtual, _ = memory_and_threads()
    return resident, virtual


def thread_count() -> Optional[int]:
    return memory_and_threads()[2]


def open_descriptor_count() -> Optional[int]:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None


def peak_resident_bytes() -> Optional[int]:
    """The most this process has ever had resident (VmHWM)."""
    value = _int(_status_value("/proc/self/status", b"VmHWM:"))
    return value * 1024 if value is not None else None


# --- its threads ------------------------------------------------------------------------------


def thread_cpu_ticks(pid: Pid, tid: object) -> Optional[int]:
    """User plus system CPU time of one thread, in clock ticks."""
    fields = _stat_fields(f"/proc/{pid}/task/{tid}/stat")
    if len(fields) < 13:
        return None
    # Fields 14 and 15 of stat(5); fields[0] here is field 3.
    return int(fields[11]) + int(fields[12])


def thread_cpu_seconds_of(pid: Pid, tid: object) -> Optional[float]:
    """User plus system CPU seconds of one thread of any process."""
    ticks = thread_cpu_ticks(pid, tid)
    return None if ticks is None else ticks / _CLOCK_TICKS


def thread_cpu_seconds(native_id: Optional[int]) -> Tuple[Optional[float], Optional[float]]:
    """(user, system) CPU seconds of one thread of this process."""
    if native_id is None:
        return None, None
    fields = _stat_fields(f"/proc/self/task/{native_id}/stat")
    if len(fields) < 13:
        return None, None
    return int(fields[11]) / _CLOCK_TICKS, int(fields[12]) / _CLOCK_TICKS


def thread_wakeups(pid: Pid, tid: object) -> Optional[int]:
    """Voluntary context switches of one thread: how often it blocked and was woken."""
    return _int(_status_value(f"/proc/{pid}/task/{tid}/status", b"voluntary_ctxt_switches:"))


def thread_name(tid: int) -> Optional[str]:
    """The OS name (comm) of thread `tid`, whatever process it belongs to."""
    name = _read_small(f"/proc/{tid}/comm")
    return name.decode("utf-8", "replace").strip() if name is not None else None


def thread_ids(pid: Pid) -> FrozenSet[int]:
    """The native ids of the process's threads now; empty when /proc does not show them."""
    try:
        return frozenset(int(task) for task in os.listdir(f"/proc/{pid}/task") if task.isdigit())
    except OSError:
        return frozenset()


def thread_names(pid: Pid) -> Dict[int, str]:
    """{native thread id: OS name} of every thread of the process (pthread_setname_np names)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    names = {}
    for task in tasks:
        name = _read_small(f"/proc/{pid}/task/{task}/comm")
        if name is not None and task.isdigit():
            names[int(task)] = name.decode("utf-8", "replace").strip()
    return names


def thread_work_done(pid: Pid, tid: object) -> Optional[Tuple[int, ...]]:
    """CPU ticks, bytes read and read calls of one thread so far: they change while it works,
    even when the Python stack does not (loading modules, reading files)."""
    counters: List[int] = []
    fields = _stat_fields(f"/proc/{pid}/task/{tid}/stat")
    if len(fields) >= 13:
        counters += [int(fields[11]), int(fields[12])]  # utime, stime
        io = _read_small_whole(f"/proc/{pid}/task/{tid}/io") or b""
        counters += [
            int(line.split()[1]) for line in io.splitlines() if line.startswith((b"rchar", b"syscr"))
        ]
    return tuple(counters) or None


def thread_syscall(pid: Pid, tid: object) -> Optional[int]:
    """The number of the system call thread `tid` is blocked in; -1 when it runs (or is in
    user space); None when /proc does not say (another user's process, no such thread)."""
    text = _read_small(f"/proc/{pid}/task/{tid}/syscall")
    if not text:
        return None
    first = text.split()[0]
    if first == b"running":
        return -1
    return _int(first)


def running_threads(pid: Pid) -> Optional[int]:
    """How many threads of the process are running or waiting for a CPU (state R), or in an
    uninterruptible wait (D: disk I/O, a page fault: work under way), right now; None when
    /proc does not show them."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    running = 0
    for task in tasks:
        fields = _stat_fields(f"/proc/{pid}/task/{task}/stat")
        if fields and fields[0] in (b"R", b"D"):
            running += 1
    return running


def namespace_pid(pid: int) -> int:
    """The number process `pid` knows itself by in its own PID namespace (the last NSpid)."""
    for line in (_read_small_whole(f"/proc/{pid}/status") or b"").splitlines():
        if line.startswith(b"NSpid:"):
            return _int(line.split()[-1]) or pid
    return pid
