"""What torch's CUDA caching allocator holds, read without ever initialising CUDA.

Only when the job has imported torch and initialised CUDA itself; reading the allocator's
counters creates no CUDA context.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from ..imported import imported

MB = 1024.0 * 1024.0


def cuda_module() -> Any:
    """torch.cuda when the job has imported torch and initialised CUDA; never initialises it."""
    torch = imported("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    try:
        return cuda if cuda is not None and cuda.is_initialized() else None
    except Exception:  # noqa: BLE001 - a half-imported torch
        return None


def cuda_device_stats() -> List[Tuple[int, Dict[str, Any]]]:
    """(device, torch.cuda.memory_stats(device)) for every device; reading the caching
    allocator's counters creates no CUDA context."""
    cuda = cuda_module()
    if cuda is None:
        return []
    found = []
    for device in range(cuda.device_count()):
        try:
            found.append((device, dict(cuda.memory_stats(device))))
        except Exception:  # noqa: BLE001 - a device this process may not use
            continue
    return found


def cuda_totals() -> Tuple[Optional[float], Optional[float]]:
    """(allocated, reserved) MB over every CUDA device, or NULLs when CUDA is not in use."""
    cuda = cuda_module()
    if cuda is None:
        return None, None
    allocated = reserved = 0
    try:
        # memory_allocated() and memory_reserved() would each build the whole stats dict again.
        for device in range(cuda.device_count()):
            stats = cuda.memory_stats(device)
            allocated += stats.get("allocated_bytes.all.current", 0)
            reserved += stats.get("reserved_bytes.all.current", 0)
    except Exception:  # noqa: BLE001
        return None, None
    return allocated / MB, reserved / MB
