"""The processes of a job as seen from its first process: descendants (DataLoader workers,
torchrun's ranks, what a shell script started). psutil is imported here, when called."""

from __future__ import annotations

from typing import List, Tuple

from ..client.discovery import python_version_of
from ..errors import ProbingError


def descendants(pid: int) -> List[Tuple[int, str]]:
    """(pid, command line) of every descendant of `pid`; [] when it is gone."""
    import psutil

    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    found = []
    for child in children:
        try:
            found.append((child.pid, " ".join(child.cmdline())))
        except psutil.Error:
            continue
    return found


def first_python(pid: int) -> int:
    """`pid` if it runs Python, else its first Python descendant (a job started by a shell
    script), else `pid` itself."""
    try:
        if python_version_of(pid) is not None:
            return pid
    except ProbingError:
        return pid
    for child, _ in descendants(pid):
        try:
            if python_version_of(child) is not None:
                return child
        except ProbingError:
            continue
    return pid
