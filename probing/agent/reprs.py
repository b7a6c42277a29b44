"""Bounded reprs for locals: never huge, never a tensor's values, never an exception."""

from __future__ import annotations

import reprlib
import sys
from typing import Any

from .imported import imported


def describe_array(value: Any) -> str:
    """A tensor or ndarray by its metadata only: printing values could be huge or sync a GPU."""
    kind = type(value).__name__
    torch = imported("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return (
            f"{kind}(shape={list(value.shape)}, dtype={value.dtype}, "
            f"device={value.device}, requires_grad={value.requires_grad})"
        )
    return f"{kind}(shape={list(value.shape)}, dtype={value.dtype})"


def is_array(value: Any) -> bool:
    torch = imported("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return True
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, numpy.ndarray)


class BoundedRepr(reprlib.Repr):
    def __init__(self, limit: int = 200) -> None:
        super().__init__()
        self.limit = max(16, limit)
        self.maxlevel = 4
        self.maxstring = min(self.limit, 120)
        self.maxother = self.limit
        self.maxlist = self.maxtuple = self.maxset = self.maxfrozenset = self.maxdeque = 8
        self.maxdict = 8

    def repr1(self, x: Any, level: int) -> str:
        if is_array(x):
            try:
                return describe_array(x)
            except Exception:  # noqa: BLE001 - a strange tensor subclass: fall back to its type
                return f"<{type(x).__name__}>"
        return super().repr1(x, level)

    def repr_instance(self, x: Any, level: int) -> str:
        try:
            text = repr(x)
        except Exception as error:  # noqa: BLE001 - a user's __repr__ may raise anything
            return f"<{type(x).__name__} object; repr failed: {type(error).__name__}>"
        if len(text) > self.maxother:
            keep = max(0, self.maxother - 3)
            text = text[: keep // 2] + "..." + text[len(text) - (keep - keep // 2) :]
        return text

    def render(self, value: Any) -> str:
        try:
            text = self.repr(value)
        except Exception as error:  # noqa: BLE001
            text = f"<{type(value).__name__} object; repr failed: {type(error).__name__}>"
        if len(text) > self.limit:
            text = text[: self.limit - 3] + "..."
        return text
