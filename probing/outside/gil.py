"""Whether the thread py-spy says holds the GIL keeps it: py-spy's word checked against /proc.

py-spy sets `owns_gil` on the thread state whose thread id equals that of the thread state the
GIL names (gilstate.tstate_current up to 3.11; gil.last_holder while gil.locked from 3.12), read
at one instant. Measured on fresh multiprocessing.Pool parents during the first command (issue
25, item 4), that names threads that hold nothing:
- when no thread holds the GIL, the id it compares with is 0, and a thread state has thread id 0
  from `_thread.start_new_thread` until the new thread first runs (3.12+): "thread '0' holds
  the GIL", a thread that does not exist yet (the agent's, starting);
- up to 3.10 py-spy finds a thread's OS id by matching pthread ids, so a thread may come with
  none ("thread 'None'") or with the id of a thread that has exited and whose pthread_t the new
  one reuses (a number not in /proc/PID/task);
- a thread that has the GIL for a moment (back from a select, its turn of a switch interval) is
  the holder at that instant and has let go of it microseconds later: it stops nobody.
(And an agent thread that threading has named "Dummy-N" was taken for the job's:
outside/pyspy.py is_agent_thread tells it by its OS name.)

So a holder is believed only when it is a thread of the process now, and /proc shows it keeping
the GIL over a few looks (`keeps_the_gil`): blocked holding it (no thread of the process runs: a
thread waiting for the GIL sleeps, and one that got it would run), or busy holding it (running at
every look while its CPU time moves: a long C call). Anything else is not named; the caller waits
on for the agent. One residue: a thread that had the GIL for a moment, caught by the dump just
before the whole process went to sleep with no thread wanting the GIL (no agent asked, none
loading), reads as blocked; that takes a dump landing on a hold of microseconds.

native/front/outside.c does the same looks, with the same constants, for the native front end.
"""

from __future__ import annotations

import os
import time

# No typing at run time: `probing PID backtrace` of a job stuck on its GIL comes through here
# (CONTRIBUTING.md, "Imports").
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional, Tuple

# The looks at /proc after a dump that flags a thread of the process: at most HOLD_LOOKS of them,
# HOLD_LOOK_S apart (~1 ms for a blocked holder, 20 ms at most). STILL_LOOKS in a row with no
# thread running is target.Stillness's test of a GIL held by a blocked thread; a busy holder that
# the scheduler keeps off the CPU a while is given the rest of the looks for its CPU time to move.
HOLD_LOOK_S = 0.001
HOLD_LOOKS = 20
STILL_LOOKS = 2


def _read(path: str) -> Optional[bytes]:
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


def _state(pid: int, tid: object) -> Optional[bytes]:
    """The one-letter state of a thread (R running, S sleeping, D in I/O...) from its stat(5);
    None when unread. The name before it may hold any byte, ')' too: it follows the last ')'."""
    text = _read(f"/proc/{pid}/task/{tid}/stat") or b""
    close = text.rfind(b")")
    return (text[close + 2 : close + 3] or None) if close >= 0 else None


def _cpu_time(pid: int, tid: object) -> Optional[int]:
    """The nanoseconds the thread has run (schedstat); None when unread. stat's CPU ticks are too
    coarse for a few looks; a kernel without schedstat (no CONFIG_SCHED_INFO) gets no busy holder
    named, only blocked ones: the command then waits for the agent, as for no holder."""
    words = (_read(f"/proc/{pid}/task/{tid}/schedstat") or b"").split()
    return int(words[0]) if words and words[0].isdigit() else None


def _look(pid: int, tid: int) -> Tuple[Optional[bytes], Optional[int]]:
    """(the holder's state, or None when it is no thread of the process; how many threads of the
    process run: state R, or D as procfs.running_threads counts it; None if /proc cannot tell)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None, None
    running = 0
    holder = None
    for task in tasks:
        state = _state(pid, task)
        running += state in (b"R", b"D")
        if task == str(tid):
            holder = state
    return holder, running


def live_thread(pid: int, tid: object) -> Optional[int]:
    """`tid` as /proc/PID/task names it, when it is a thread of the process; None otherwise (0,
    None, an exited thread, another process's). A process in another PID namespace knows its
    threads by the innermost numbers of their NSpid lines, which is what py-spy may report."""
    if not isinstance(tid, int) or isinstance(tid, bool) or tid <= 0:
        return None
    if os.path.exists(f"/proc/{pid}/task/{tid}"):
        return tid
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for task in tasks:
        status = _read(f"/proc/{pid}/task/{task}/status") or b""
        numbers = next((line.split()[1:] for line in status.splitlines() if line.startswith(b"NSpid:")), [])
        if len(numbers) > 1 and numbers[-1] == str(tid).encode():
            return int(task)
    return None


def keeps_the_gil(pid: int, tid: object) -> bool:
    """Whether thread `tid` of `pid`, just seen holding the GIL, keeps it (see the module's
    docstring); False at once for a thread that is not one of the process's."""
    task = live_thread(pid, tid)
    if task is None:
        return False
    still = 0
    busy = True
    first_cpu: Optional[int] = None
    for look in range(HOLD_LOOKS):
        if look:
            time.sleep(HOLD_LOOK_S)
        state, running = _look(pid, task)
        if state is None or running is None:
            return False  # it exited: whatever it held, it holds nothing now
        still = still + 1 if running == 0 else 0
        if still >= STILL_LOOKS:
            return True
        cpu = _cpu_time(pid, task) if busy and state == b"R" else None
        busy = cpu is not None
        if busy and first_cpu is None:
            first_cpu = cpu
        elif busy and first_cpu is not None and cpu is not None and cpu > first_cpu:
            return True
    return False
