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


def memory_bytes() -> Tuple[Optional[int], Optional[int]]:
    """(resident, virtual) bytes of this process, from /proc/self/statm."""
    try:
        with open("/proc/self/statm", "rb") as handle:
            fields = handle.read().split()
        return int(fields[1]) * _PAGE_SIZE, int(fields[0]) * _PAGE_SIZE
    except (OSError, IndexError, ValueError):
        return None, None


def thread_count() -> Optional[int]:
    fields = _stat_fields("/proc/self/stat")
    if fields is None or len(fields) < 18:
        return None
    return int(fields[17])  # field 20 of stat(5)


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
