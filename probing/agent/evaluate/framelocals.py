"""Reading a running frame's locals without changing the frame.

`frame.f_locals` on CPython 3.8 to 3.12 is not a read: it copies every fast local into the
frame's own locals dict (PyFrame_FastToLocals) and leaves that copy there. The copy holds a
reference to each value until the frame ends or someone asks again: a training function's
`outputs` or `batch` from the step in which someone looked would stay alive for the rest of
training (on a GPU, a logits tensor of several GB). A class body's frame would even get its
`__class__` cell written into the namespace of the class being built. And the copy is the
very dict a job that called `locals()` in that function holds.

So on those versions the values are read where the interpreter keeps them, the frame's
`localsplus` array, through ctypes: a pointer read per name, under the GIL, nothing written.
The layout is the one each version's headers declare; it is checked on every frame (the
code, globals and frame pointers read back must be that frame's own) and once against a
frame whose locals are known (a local, an argument kept in a cell, a cell, a free variable).
A layout that does not check out reads nothing: the caller says the frames could not be read.

3.13 (PEP 667) made `frame.f_locals` a proxy that reads the fast locals in place: used as is.
"""

from __future__ import annotations

import ctypes
import sys
import types
from types import FrameType
from typing import Any, Dict, Optional, Tuple

CO_OPTIMIZED = 0x1
_POINTER = ctypes.sizeof(ctypes.c_void_p)
_PROXY_LOCALS = sys.version_info >= (3, 13)


class Layout:
    """Where one CPython version keeps a frame's code, globals, locals mapping and fast locals."""

    def __init__(self, version: Tuple[int, int]) -> None:
        self.version = version

    def _pointer(self, address: int) -> int:
        return ctypes.c_void_p.from_address(address).value or 0

    def base(self, frame: FrameType) -> int:
        """The address the offsets below count from; 0 when the frame does not check out."""
        p = _POINTER
        if self.version < (3, 11):
            base, code, globals_, frame_at = id(frame), 4 * p, 6 * p, None
        else:
            base = self._pointer(id(frame) + 3 * p)  # PyFrameObject.f_frame
            if self.version < (3, 12):
                code, globals_, frame_at = 4 * p, 1 * p, 5 * p
            else:
                code, globals_, frame_at = 0, 3 * p, 6 * p
        if not base or self._pointer(base + code) != id(frame.f_code):
            return 0
        if self._pointer(base + globals_) != id(frame.f_globals):
            return 0
        if frame_at is not None and self._pointer(base + frame_at) != id(frame):
            return 0
        return base

    def locals_mapping_offset(self) -> int:
        p = _POINTER
        return 7 * p if self.version < (3, 11) else (3 * p if self.version < (3, 12) else 5 * p)

    def fast_offset(self, frame: FrameType) -> int:
        if self.version < (3, 11):
            # f_localsplus is the flexible array that ends PyFrameObject.
            return int(type(frame).__basicsize__) - _POINTER
        return 9 * _POINTER  # _PyInterpreterFrame.localsplus, after 8 pointers' worth of fields

    def slot(self, code: types.CodeType, name: str) -> Tuple[int, bool]:
        """(index in localsplus, whether the slot holds a cell); (-1, False) if not declared."""
        varnames, cellvars, freevars = code.co_varnames, code.co_cellvars, code.co_freevars
        if self.version < (3, 11):
            # Locals, then every cell (an argument kept in a cell has its own slot cleared), then
            # the free variables.
            if name in cellvars:
                return len(varnames) + cellvars.index(name), True
            if name in freevars:
                return len(varnames) + len(cellvars) + freevars.index(name), True
            if name in varnames:
                return varnames.index(name), False
            return -1, False
        # One array of names: the locals (an argument kept in a cell keeps its place), the
        # other cells, the free variables.
        if name in varnames:
            return varnames.index(name), name in cellvars
        other_cells = [cell for cell in cellvars if cell not in varnames]
        if name in other_cells:
            return len(varnames) + other_cells.index(name), True
        if name in freevars:
            return len(varnames) + len(other_cells) + freevars.index(name), True
        return -1, False


_UNBOUND = object()
_layout: Optional[Layout] = None
_layout_checked = False


def _object_at(address: int) -> Any:
    pointer = ctypes.c_void_p.from_address(address).value
    if not pointer:
        return _UNBOUND
    return ctypes.cast(pointer, ctypes.py_object).value


def _read_fast(layout: Layout, frame: FrameType, name: str) -> Any:
    code = frame.f_code
    base = layout.base(frame)
    if not base:
        return _UNBOUND
    if not code.co_flags & CO_OPTIMIZED:
        mapping = _object_at(base + layout.locals_mapping_offset())
        # Only a plain dict: another mapping's __getitem__ would run the job's code.
        if type(mapping) is dict:
            return mapping.get(name, _UNBOUND)
        return _UNBOUND
    index, is_cell = layout.slot(code, name)
    if index < 0:
        return _UNBOUND
    value = _object_at(base + layout.fast_offset(frame) + index * _POINTER)
    if is_cell and type(value) is types.CellType:  # type: ignore[attr-defined,unused-ignore]
        try:
            return value.cell_contents
        except ValueError:  # an empty cell: the name is not bound yet
            return _UNBOUND
    return value


def _known_frame() -> bool:
    """Whether the layout reads back the locals of a frame whose locals are known."""
    layout = Layout(sys.version_info[:2])

    def outer(argument_in_cell: Any) -> bool:
        cell = "cell"

        def inner() -> bool:
            plain = "plain"
            frame = sys._getframe()
            return (
                all(
                    _read_fast(layout, frame, name) == expected
                    for name, expected in (
                        ("plain", plain),
                        ("cell", cell),
                        ("argument_in_cell", argument_in_cell),
                    )
                )
                and _read_fast(layout, frame, "missing") is _UNBOUND
            )

        frame = sys._getframe()
        found = (
            _read_fast(layout, frame, "argument_in_cell") == "argument"
            and _read_fast(layout, frame, "cell") == cell
        )
        return found and inner()

    try:
        return outer("argument")
    except Exception:  # noqa: BLE001 - a layout that does not fit reads nothing
        return False


def usable_layout() -> Optional[Layout]:
    """This interpreter's layout, once checked; None when it cannot be read safely."""
    global _layout, _layout_checked
    if not _layout_checked:
        version = sys.version_info[:2]
        if (3, 8) <= version < (3, 13) and sys.implementation.name == "cpython" and _known_frame():
            _layout = Layout(version)
        _layout_checked = True
    return _layout


def can_read() -> bool:
    """Whether locals of running frames can be read without changing them on this Python."""
    return _PROXY_LOCALS or usable_layout() is not None


def declares(frame: FrameType, name: str) -> bool:
    """Whether `name` is a local of the frame's code (bound or not yet); for a module or class
    body, whether its namespace holds it now."""
    code = frame.f_code
    if not code.co_flags & CO_OPTIMIZED:
        return read(frame, name)[0]
    return name in code.co_varnames or name in code.co_cellvars or name in code.co_freevars


def local_names(frame: FrameType) -> Tuple[str, ...]:
    """The names a function frame can hold, from its code (a module frame's are its globals')."""
    code = frame.f_code
    if not code.co_flags & CO_OPTIMIZED:
        return ()
    return tuple(dict.fromkeys(code.co_varnames + code.co_cellvars + code.co_freevars))


def read(frame: FrameType, name: str) -> Tuple[bool, Any]:
    """(found, value) of local `name` of `frame`, the frame left exactly as it was."""
    if _PROXY_LOCALS:
        names = frame.f_locals
        try:
            return True, names[name]
        except KeyError:
            return False, None
    layout = usable_layout()
    if layout is None:
        return False, None
    value = _read_fast(layout, frame, name)
    return (False, None) if value is _UNBOUND else (True, value)


def snapshot(frame: FrameType) -> Dict[str, Any]:
    """A copy of the frame's locals (for `--frame`): what the code assigns goes to the copy,
    never into the frame. Where they cannot be read safely, a copy of `frame.f_locals`."""
    code = frame.f_code
    if _PROXY_LOCALS or usable_layout() is None:
        return dict(frame.f_locals)
    if not code.co_flags & CO_OPTIMIZED:
        layout = usable_layout()
        assert layout is not None
        base = layout.base(frame)
        mapping = _object_at(base + layout.locals_mapping_offset()) if base else _UNBOUND
        return dict(mapping) if type(mapping) is dict else {}
    copied: Dict[str, Any] = {}
    for name in local_names(frame):
        found, value = read(frame, name)
        if found:
            copied[name] = value
    return copied
