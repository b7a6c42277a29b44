"""The tensors of a module's output or inputs, and how many NaN and Inf a tensor a check found
not finite holds (weights.py counts those of the weights; the checks themselves reduce on the
device, ledger.py). Run in the training thread only."""

from __future__ import annotations

import math
from typing import Any, List, Optional, Sequence, Tuple


def flat_tensors(value: Any, torch: Any, limit: int = 64) -> List[Any]:
    """Tensors in a module's output or inputs: a tensor, or nested tuples, lists and dicts."""
    found: List[Any] = []
    stack = [value]
    while stack and len(found) < limit:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, (tuple, list)):
            stack.extend(reversed(item))
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
    return found


def nonfinite(tensors: Sequence[Any], torch: Any) -> Optional[Tuple[int, int, int]]:
    """(index, nan count, inf count) of the first tensor holding NaN or Inf, or None: one
    `aminmax` a tensor (both finite exactly when every value is), reading each back."""
    for index, tensor in enumerate(tensors):
        if tensor is None or not tensor.is_floating_point() or tensor.numel() == 0:
            continue
        data = tensor.detach()
        low, high = torch.aminmax(data)
        if math.isfinite(low.item()) and math.isfinite(high.item()):
            continue
        return index, int(torch.isnan(data).sum().item()), int(torch.isinf(data).sum().item())
    return None


def describe_tensor(tensor: Any) -> str:
    dtype = str(tensor.dtype).replace("torch.", "")
    return f"{dtype}{list(tensor.shape)} on {tensor.device}"
