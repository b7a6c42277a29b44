"""Lines of the job's source files, for tracebacks and reports."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional


class SourceLines:
    """Lines of the job's source files, read by the CLI so the target does no file I/O."""

    def __init__(self, pid: Optional[int]) -> None:
        self.pid = pid
        self._files: Dict[str, List[str]] = {}

    def line(self, filename: str, lineno: Optional[int]) -> str:
        if not lineno or filename.startswith("<"):
            return ""
        lines = self._files.get(filename)
        if lines is None:
            lines = self._files[filename] = self._read(filename)
        return lines[lineno - 1].strip() if 0 < lineno <= len(lines) else ""

    def _read(self, filename: str) -> List[str]:
        # A job in a container sees its files under its own root.
        for path in (filename, f"/proc/{self.pid}/root{filename}" if self.pid else None):
            if path is None:
                continue
            try:
                with open(path, "rb") as handle:
                    return handle.read().decode("utf-8", "replace").splitlines()
            except OSError:
                continue
        return []
