"""A process in another mount namespace (a container) cannot open files by our paths.

The helper library it is made to dlopen, and the agent it then loads, must be files of its
own file system: the probing package is copied into its /tmp through /proc/PID/root, once
per probing version, and the injector is given the path as the process sees it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Tuple

from .. import __version__
from ..errors import AttachFailed
from ..procfs import View
from .methods import HELPER, PACKAGE, native


def _same_file(first: str, second: str) -> bool:
    try:
        return os.path.samefile(first, second)
    except OSError:
        return False


def helper_paths(pid: int) -> Tuple[str, str]:
    """(the helper as we read it, the helper as the process opens it)."""
    helper = native(HELPER)
    view = View(pid)
    if not view.root or _same_file(helper, view.path(helper)):
        return helper, helper
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
                    f"cannot copy probing into the container of PID {pid} ({view.path(inside)}): {error}",
                    hint="start the job with the agent instead: `probing run -- python train.py`",
                ) from None
    return str(staged / "_native" / HELPER.name), f"{inside}/probing/_native/{HELPER.name}"
