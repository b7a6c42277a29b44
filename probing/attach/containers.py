"""A process whose file system is not ours cannot open files by our paths: one in another
mount namespace (a container), or in a chroot (our namespace, another root).

The helper library it is made to dlopen, and the agent it then loads, must be files of its
own file system: the probing package is copied into its /tmp through /proc/PID/root, once
per probing version, and the injector is given the path as the process sees it. The helper
finds the agent's Python files next to the path it was loaded by (native/helper.c), and the
agent's loader imports them by file path: the copy is never put on the job's sys.path, nor
the CLI's site-packages (DESIGN.md, "Attaching without harming the target", rule 4). The
agent's socket is then a file of that file system too, found by client/discovery.py socket_candidates
through the same /proc/PID/root (client/discovery.py View).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import NamedTuple

from .. import __version__
from ..client.discovery import View
from ..errors import AttachFailed
from .methods import HELPER, PACKAGE, native


class HelperPaths(NamedTuple):
    local: str  # the helper as we read it
    in_target: str  # the helper as the process opens it
    elsewhere: str  # "" when the process sees our files; else where it lives, for -v


def _same_file(first: str, second: str) -> bool:
    try:
        return os.path.samefile(first, second)
    except OSError:
        return False


def _where_it_lives(root: str) -> str:
    # /proc/PID/root reads as the directory of the process's root seen from ours: "/" for a
    # container that pivoted onto its own root, the chroot's directory for a chroot.
    try:
        directory = os.readlink(root)
    except OSError:
        directory = "/"
    if directory == "/":
        return "in another mount namespace"
    return f"in a chroot ({directory})"


def helper_paths(pid: int) -> HelperPaths:
    """Where the helper is for us and for the process; copies probing in when it cannot see ours."""
    helper = native(HELPER)
    view = View(pid)
    if not view.root or _same_file(helper, view.path(helper)):
        return HelperPaths(helper, helper, "")
    elsewhere = _where_it_lives(view.root)
    inside = f"/tmp/probing-{__version__}-{os.geteuid()}"
    staged = Path(view.path(inside)) / "probing"
    if not (staged / "_native" / HELPER.name).exists():
        try:
            staging = Path(view.path(f"{inside}.{os.getpid()}"))
            shutil.copytree(PACKAGE, staging / "probing", ignore=shutil.ignore_patterns("__pycache__"))
            for directory, _, files in os.walk(staging):
                os.chmod(directory, 0o755)
                for name in files:
                    os.chmod(os.path.join(directory, name), 0o755 if name.endswith(".so") else 0o644)
            os.replace(staging, view.path(inside))
        except OSError as error:
            if not (staged / "_native" / HELPER.name).exists():  # another attach may have won the race
                raise AttachFailed(
                    f"PID {pid} is {elsewhere}, and probing cannot be copied into its /tmp "
                    f"({view.path(inside)}): {error}",
                    hint="start the job with the agent instead: `probing run -- python train.py`",
                ) from None
    return HelperPaths(
        str(staged / "_native" / HELPER.name), f"{inside}/probing/_native/{HELPER.name}", elsewhere
    )
