"""Started by probing-autostart.pth at interpreter start-up when PROBING is set.

Runs inside `site`, before the user's program: it must never raise and never print.
"""

import os
import sys

_OFF = ("", "0", "false", "no", "off")


def _wanted() -> bool:
    if os.environ.get("PROBING", "").strip().lower() in _OFF:
        return False
    # The probing CLI itself never serves, even with PROBING=1 exported in the shell.
    program = os.path.basename(sys.argv[0]) if getattr(sys, "argv", None) else ""
    return program != "probing"


def autostart() -> None:
    try:
        if _wanted():
            from . import start

            start()
    except Exception:  # noqa: BLE001 - the job's start-up must go on whatever happens here
        pass


autostart()
