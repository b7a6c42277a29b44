"""What makes a record: its reason, and where the thread that met it was. Light to import:
the hooks hold one of these, and they are installed at agent start."""

from __future__ import annotations

import threading
from types import FrameType
from typing import List, Optional


class Trigger:
    """What makes a record: its reason, and where the thread that met it was."""

    def __init__(
        self,
        kind: str,
        message: str = "",
        signum: Optional[int] = None,
        error: Optional[BaseException] = None,
        thread: Optional[threading.Thread] = None,
        frame: Optional[FrameType] = None,
        training_thread: bool = False,
        status: Optional[int] = None,
        locals: bool = True,
        helper_thread: bool = False,
    ) -> None:
        self.kind = kind
        self.message = message
        self.signum = signum
        self.error = error
        # The thread the exception ended (threading.excepthook), else the writing thread.
        self.thread = thread
        # Where `thread` (else the writing thread) was when the signal came (the handler's frame).
        self.frame = frame
        self.training_thread = training_thread
        self.status = status
        # Whether the record may run the job's __repr__ for locals (not from a signal's path).
        self.locals = locals
        # Written by a thread started for it, which the backtrace leaves out.
        self.helper_thread = helper_thread
        # Said about this record while it was being written (by the thread that asked for it).
        self.notes: List[str] = []

    @classmethod
    def from_exception(cls, error: BaseException, thread: threading.Thread, training_thread: bool) -> Trigger:
        # traceback (which classify needs) costs a dozen ms to import: only when a job dies.
        from .classify import exit_status, headline, reason_kind

        main = thread is threading.main_thread()
        return cls(
            reason_kind(error), headline(error), error=error, thread=thread,
            training_thread=training_thread, status=exit_status(error) if main else None,
        )  # fmt: skip
