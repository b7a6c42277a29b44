"""Tensor storages, known from tensor metadata alone: where a storage starts, on which device,
and how far its live tensors reach into it. No tensor data is read, and no storage object is
made (see StorageReach).

A storage is known by one int, its base address and its device's number together: the dicts
that hold them map ints to ints, which gc does not track, so a census taken while another's
storages are kept (memory --growth) does not count them as the job's objects.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

# Room for this many devices in a storage's key (key = base address * DEVICE_SLOTS + device).
DEVICE_SLOTS = 1024
_device_numbers: Dict[str, int] = {}
_device_names: Dict[int, str] = {}


def device_number(device: str) -> int:
    number = _device_numbers.get(device)
    if number is None:
        number = _device_numbers[device] = len(_device_numbers) % DEVICE_SLOTS
        _device_names[number] = device
    return number


def device_of(key: int) -> str:
    """The device a storage's key names ('cpu', 'cuda:0')."""
    return _device_names.get(key % DEVICE_SLOTS, "?")


def storage_extent(tensor: Any) -> Optional[Tuple[int, int]]:
    """(the storage's key, the bytes this tensor reaches into it), or None for a tensor with no
    storage to count (meta tensors, empty storages, sparse, nested or fake tensors).

    Read from metadata only (address, offset, shape, strides, element size): the agent's
    threads never touch tensor data.
    """
    try:
        element = tensor.element_size()
        offset = tensor.storage_offset()
        base = tensor.data_ptr() - offset * element
        if base == 0:
            return None
        end = offset + 1
        for length, stride in zip(tensor.shape, tensor.stride()):
            if length == 0:
                end = offset
                break
            end += (length - 1) * stride
        device = str(tensor.device)
    except Exception:  # noqa: BLE001 - sparse, nested or fake tensors
        return None
    return base * DEVICE_SLOTS + device_number(device), end * element


class StorageReach:
    """Each storage once: views and parameters sharing memory are not counted twice.

    The storage is found from the tensor's address and offset rather than with
    tensor.untyped_storage(), which would give every storage a Python object that lives as long
    as the storage does: a census must not add objects to the job. A storage's size is the
    furthest byte any of its live tensors reaches (views count what they see), so it is a lower
    bound: a small slice that alone keeps a big buffer alive counts as the slice.
    """

    def __init__(self) -> None:
        self.reach: Dict[int, int] = {}  # storage key -> bytes
        self.owner: Dict[int, type] = {}  # storage key -> the type of the first tensor seen on it
        self.tensors = 0

    def add(self, tensor: Any) -> None:
        self.tensors += 1
        extent = storage_extent(tensor)
        if extent is None:
            return
        key, size = extent
        if self.reach.get(key, -1) < size:
            self.reach[key] = size
            self.owner.setdefault(key, type(tensor))
