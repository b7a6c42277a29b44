"""Starts the agent in an interpreter that does not have probing installed.

`probing run` puts this file's directory first on PYTHONPATH, so any CPython 3.8+ imports it
at start-up. It loads the agent from the CLI's own install (loader.py), then takes its own
directory off sys.path and hands over to the sitecustomize it shadowed (Debian ships one),
so the job's imports resolve exactly as they would have without probing.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _start_agent() -> None:
    if os.environ.get("PROBING", "").strip().lower() in ("", "0", "false", "no", "off"):
        return
    try:
        loader: dict = {}  # type: ignore[type-arg]
        with open(os.path.join(_HERE, "loader.py"), "rb") as source:
            exec(compile(source.read(), source.name, "exec"), loader)
        loader["start_agent"](os.path.dirname(_HERE))
    except Exception:  # noqa: BLE001 - never break the job's start-up, never print in it
        pass


def _hand_over() -> None:
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or ".") != _HERE]
    from importlib.machinery import PathFinder

    if PathFinder.find_spec("sitecustomize", sys.path) is None:
        return  # nothing shadowed: site's own import keeps this module as sitecustomize
    # Importing again puts the shadowed module in sys.modules, where site's import looks.
    del sys.modules["sitecustomize"]
    import sitecustomize  # type: ignore[import-not-found]  # noqa: F401


_start_agent()
_hand_over()
