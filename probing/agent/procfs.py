"""What /proc says about this process: per-thread CPU times, start time."""

from __future__ import annotations

import os
from typing import List, Optional, Tuple

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat_fields(path: str) -> Optional[List[str]]:
    try:
        with open(path, "rb") as handle:
            text = handle.read().decode("ascii", "replace")
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    return text[text.rfind(")") + 2 :].split()


def thread_cpu_seconds(native_id: Optional[int]) -> Tuple[Optional[float], Optional[float]]:
    """(user, system) CPU seconds of one thread of this process, from /proc/self/task."""
    if native_id is None:
        return None, None
    fields = _stat_fields(f"/proc/self/task/{native_id}/stat")
    if fields is None or len(fields) < 13:
        return None, None
    # Fields 14 and 15 of stat(5); fields[0] here is field 3.
    return int(fields[11]) / _CLOCK_TICKS, int(fields[12]) / _CLOCK_TICKS


def process_start_time() -> Optional[float]:
    """Seconds since the epoch at which this process started."""
    fields = _stat_fields("/proc/self/stat")
    if fields is None or len(fields) < 20:
        return None
    try:
        with open("/proc/stat", "rb") as handle:
            for line in handle:
                if line.startswith(b"btime "):
                    return int(line.split()[1]) + int(fields[19]) / _CLOCK_TICKS
    except OSError:
        return None
    return None


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


def memory_and_threads() -> Tuple[Optional[int], Optional[int], Optional[int]]:
    """(resident bytes, virtual bytes, OS threads) of this process, from one read of
    /proc/self/stat (one file, not statm as well: each read costs tens of microseconds)."""
    text = _read_small("/proc/self/stat")
    fields = text[text.rfind(b")") + 2 :].split() if text is not None else []
    if len(fields) < 22:
        return None, None, None
    # Fields 20 (num_threads), 23 (vsize, bytes) and 24 (rss, pages) of stat(5).
    return int(fields[21]) * _PAGE_SIZE, int(fields[20]), int(fields[17])


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
    try:
        with open("/proc/self/status", "rb") as handle:
            for line in handle:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
