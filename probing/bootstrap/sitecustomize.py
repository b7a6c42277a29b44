"""Starts the agent in an interpreter that does not have probing installed.

`probing run` puts this file's directory first on PYTHONPATH, so any CPython 3.8+ imports it
at start-up. It loads the agent by file path from the CLI's own install, without adding the
CLI's site-packages (or anything else) to the job's sys.path, then takes its own directory
off sys.path and hands over to the sitecustomize it shadowed (Debian ships one), so the
job's imports resolve exactly as they would have without probing.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_PACKAGE_DIR = os.path.dirname(_HERE)


def _start_agent() -> None:
    if os.environ.get("PROBING", "").strip().lower() in ("", "0", "false", "no", "off"):
        return
    try:
        if "probing" not in sys.modules:
            import importlib.util

            spec = importlib.util.spec_from_file_location(
                "probing",
                os.path.join(_PACKAGE_DIR, "__init__.py"),
                submodule_search_locations=[_PACKAGE_DIR],
            )
            if spec is None or spec.loader is None:
                return
            package = importlib.util.module_from_spec(spec)
            sys.modules["probing"] = package
            spec.loader.exec_module(package)
        from probing.agent import start

        start()
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
