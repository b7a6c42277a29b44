"""Reading a running frame's locals without changing the frame.

`frame.f_locals` on CPython 3.8 to 3.12 is not a read: it copies every fast local into the
frame's own locals dict (PyFrame_FastToLocals) and leaves that copy there. The copy holds a
reference to each value until the frame ends or someone asks again: a training function's
`outputs` or `batch` from the step in which someone looked would stay alive for the rest of
training (on a GPU, a logits tensor of several GB). A class body's frame would even get its
`__class__` cell written into the namespace of the class being built. And the copy is the
very dict a job that called `locals()` in that function holds.

So each version is read where its interpreter keeps the value, and each read of a value is one
step that takes a reference under the GIL, so the job's thread cannot rebind the local (and
free the old value) half-way through:
- 3.13 (PEP 667): `frame.f_locals` is a proxy that reads the fast locals in place.
- 3.12: `PyFrame_GetVar`, one C call.
- 3.8-3.10: the frame object holds its `f_localsplus` array, alive as long as we hold the frame:
  the slot is read and its object taken by ctypes in one C-level step.
- 3.11: the slots live in the thread's data stack, which the frame leaves when its function
  returns (the memory is then reused by the next call). The frame's place is read, checked
  (its code and frame object read back must be this frame's) and the slot taken in one
  stretch of bytecode without calls or backward jumps, where 3.11 never hands the GIL to
  another thread: the frame cannot leave between the check and the read.
The slot layouts are each version's headers, checked once against a frame whose locals are
known (a local, an argument kept in a cell, a cell, a free variable): a layout that does not
check out reads nothing, and the caller says the frames could not be read.

A module's frame reads its globals (its namespace); a class body's frame is not read.
"""

from __future__ import annotations

import ctypes
import sys
import types
from types import FrameType
from typing import Any, Dict, Optional, Tuple

CO_OPTIMIZED = 0x1
_POINTER = ctypes.sizeof(ctypes.c_void_p)
_VERSION = sys.version_info[:2]
_PROXY_LOCALS = _VERSION >= (3, 13)
_UNBOUND = object()


def slot_of(code: types.CodeType, name: str) -> Tuple[int, bool]:
    """(index in the frame's fast locals, whether the slot holds a cell); (-1, False) if the
    code has no such local."""
    varnames, cellvars, freevars = code.co_varnames, code.co_cellvars, code.co_freevars
    if _VERSION < (3, 11):
        # Locals, then every cell (an argument kept in a cell has its own slot cleared), then
        # the free variables.
        if name in cellvars:
            return len(varnames) + cellvars.index(name), True
        if name in freevars:
            return len(varnames) + len(cellvars) + freevars.index(name), True
        if name in varnames:
            return varnames.index(name), False
        return -1, False
    # One array: the locals (an argument kept in a cell keeps its place), the other cells, the
    # free variables.
    if name in varnames:
        return varnames.index(name), name in cellvars
    other_cells = [cell for cell in cellvars if cell not in varnames]
    if name in other_cells:
        return len(varnames) + other_cells.index(name), True
    if name in freevars:
        return len(varnames) + len(other_cells) + freevars.index(name), True
    return -1, False


def _slot_of_frame_object(frame: FrameType, index: int) -> Any:
    """3.8-3.10: the object in slot `index` of the frame object's own f_localsplus array (the
    flexible array that ends PyFrameObject), or _UNBOUND."""
    p = _POINTER
    address = id(frame)
    # PyObject_VAR_HEAD (3 words), f_back, then f_code and f_builtins, f_globals.
    if ctypes.c_void_p.from_address(address + 4 * p).value != id(frame.f_code):
        return _UNBOUND
    if ctypes.c_void_p.from_address(address + 6 * p).value != id(frame.f_globals):
        return _UNBOUND
    slot = ctypes.py_object.from_address(address + int(type(frame).__basicsize__) - p + index * p)
    try:
        return slot.value  # reads the pointer and takes a reference in one C step
    except ValueError:  # NULL: not bound
        return _UNBOUND


def _slot_of_data_stack(frame: FrameType, index: int) -> Any:
    """3.11: the object in slot `index` of the frame's _PyInterpreterFrame, or _UNBOUND."""
    p = _POINTER
    # Everything that calls into C is set up first: pointers aimed by writing their address.
    place = ctypes.c_void_p.from_address(id(frame) + 3 * p)  # PyFrameObject.f_frame
    word = ctypes.POINTER(ctypes.c_void_p)()
    aim_word = ctypes.c_void_p.from_address(ctypes.addressof(word))
    value = ctypes.POINTER(ctypes.py_object)()
    aim_value = ctypes.c_void_p.from_address(ctypes.addressof(value))
    code_id, frame_id = id(frame.f_code), id(frame)
    # From here to the read: attribute and item access, arithmetic and forward jumps only, no
    # call and no loop, so this thread keeps the GIL and the frame stays where it was checked.
    base = place.value
    if not base:
        return _UNBOUND
    aim_word.value = base + 4 * p  # f_code
    if word[0] != code_id:
        return _UNBOUND
    aim_word.value = base + 5 * p  # frame_obj
    if word[0] != frame_id:
        return _UNBOUND
    aim_word.value = aim_value.value = base + 9 * p + index * p  # localsplus[index]
    if not word[0]:
        return _UNBOUND
    return value[0]


def _get_var(frame: FrameType, name: str) -> Any:
    """3.12: PyFrame_GetVar, which reads the slot (and a cell's contents) in one C call."""
    get_var = ctypes.pythonapi.PyFrame_GetVar
    get_var.restype = ctypes.py_object
    get_var.argtypes = (ctypes.py_object, ctypes.py_object)
    try:
        return get_var(frame, name)
    except NameError:
        return _UNBOUND


def _read_optimized(frame: FrameType, name: str) -> Any:
    if _VERSION == (3, 12):
        return _get_var(frame, name)
    index, is_cell = slot_of(frame.f_code, name)
    if index < 0:
        return _UNBOUND
    if _VERSION < (3, 11):
        value = _slot_of_frame_object(frame, index)
    else:
        value = _slot_of_data_stack(frame, index)
    if is_cell and type(value) is types.CellType:  # type: ignore[attr-defined,unused-ignore]
        try:
            return value.cell_contents  # we hold the cell: it cannot go away
        except ValueError:  # an empty cell: not bound yet
            return _UNBOUND
    return value


def _known_frame() -> bool:
    """Whether this version's reader reads back the locals of a frame whose locals are known."""

    def outer(argument_in_cell: Any) -> bool:
        cell = "cell"

        def inner() -> bool:
            plain = "plain"
            frame = sys._getframe()
            expected = (("plain", plain), ("cell", cell), ("argument_in_cell", argument_in_cell))
            found = all(_read_optimized(frame, name) == value for name, value in expected)
            return found and _read_optimized(frame, "missing") is _UNBOUND

        frame = sys._getframe()
        found = (
            _read_optimized(frame, "argument_in_cell") == "argument"
            and _read_optimized(frame, "cell") == cell
        )
        return found and inner()

    try:
        return outer("argument")
    except Exception:  # noqa: BLE001 - a reader that does not fit reads nothing
        return False


_readable: Optional[bool] = None


def can_read() -> bool:
    """Whether locals of running frames can be read without changing them on this Python."""
    global _readable
    if _readable is None:
        _readable = _PROXY_LOCALS or (
            (3, 8) <= _VERSION < (3, 13) and sys.implementation.name == "cpython" and _known_frame()
        )
    return _readable


def _is_module(frame: FrameType) -> bool:
    return frame.f_code.co_name == "<module>"


def declares(frame: FrameType, name: str) -> bool:
    """Whether `name` is a local of the frame's code (bound or not yet); for a module's frame,
    whether its namespace holds it now."""
    code = frame.f_code
    if not code.co_flags & CO_OPTIMIZED:
        return _is_module(frame) and name in frame.f_globals
    return name in code.co_varnames or name in code.co_cellvars or name in code.co_freevars


def local_names(frame: FrameType) -> Tuple[str, ...]:
    """The names a function frame can hold, from its code (a module frame's are its globals')."""
    code = frame.f_code
    if not code.co_flags & CO_OPTIMIZED:
        return ()
    return tuple(dict.fromkeys(code.co_varnames + code.co_cellvars + code.co_freevars))


def read(frame: FrameType, name: str) -> Tuple[bool, Any]:
    """(found, value) of local `name` of `frame`, the frame left exactly as it was."""
    if not frame.f_code.co_flags & CO_OPTIMIZED:
        names = frame.f_globals
        if not _is_module(frame) or name not in names:
            return False, None
        return True, names[name]
    if _PROXY_LOCALS:
        try:
            return True, frame.f_locals[name]
        except KeyError:
            return False, None
    if not can_read():
        return False, None
    value = _read_optimized(frame, name)
    return (False, None) if value is _UNBOUND else (True, value)


def snapshot(frame: FrameType) -> Dict[str, Any]:
    """A copy of the frame's locals (for `--frame`): what the code assigns goes to the copy,
    never into the frame. Where they cannot be read safely, a copy of `frame.f_locals`."""
    if not frame.f_code.co_flags & CO_OPTIMIZED:
        return dict(frame.f_globals) if _is_module(frame) else dict(frame.f_locals)
    if not can_read():
        return dict(frame.f_locals)
    copied: Dict[str, Any] = {}
    for name in local_names(frame):
        found, value = read(frame, name)
        if found:
            copied[name] = value
    return copied
