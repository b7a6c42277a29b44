"""Loads the agent from this install into a process that may not have probing installed.

Executed by file path (never imported through sys.path) by sitecustomize.py (`probing run`)
and attach.py (a process probing attached to). It imports the `probing` package from the
directory above this one by file path, so neither the CLI's site-packages nor anything else
is added to the process's sys.path, and no third-party module is imported.
"""

import os
import sys


def start_agent(package_dir: str) -> "str | None":
    """Start the agent; returns None, or why it could not start. Never raises, never prints."""
    try:
        if "probing" not in sys.modules:
            import importlib.util

            spec = importlib.util.spec_from_file_location(
                "probing",
                os.path.join(package_dir, "__init__.py"),
                submodule_search_locations=[package_dir],
            )
            if spec is None or spec.loader is None:
                return "cannot load the probing package from " + package_dir
            package = importlib.util.module_from_spec(spec)
            sys.modules["probing"] = package
            spec.loader.exec_module(package)
        import probing.agent as agent

        if agent.start():
            return None
        return agent.last_error or "the agent did not start"
    except Exception as error:  # noqa: BLE001 - the job must never see our failure
        return f"{type(error).__name__}: {error}"
