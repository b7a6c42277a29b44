"""python.tensors' held_by column: for each tensor that is no parameter, gradient or buffer, what
holds it (`__main__.history[17]`), from the bounded walk of holders.py.

The rows come from pytorch/state.py as metadata only, without the tensors, so a tensor the walk
meets is matched to a row by what the row shows (shape, dtype, device, bytes, requires_grad,
is_param): where several rows show the same, the paths found go to them in order, so the rows
that read alike share the paths found for tensors that read alike. A tensor made after the
listing could take a row's path; the column's documentation says how it is matched.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from ..pacing import Pacer
from .holders import find_holders

# python.tensors' columns (schema/torch_tables.py), as pytorch/state.py fills them.
NAME, KIND, SHAPE, DTYPE, DEVICE, BYTES, REQUIRES_GRAD, IS_PARAM = range(8)
Looks = Tuple[str, str, str, int, bool, bool]


def _row_looks(row: Tuple[Any, ...]) -> Looks:
    return (row[SHAPE], row[DTYPE], row[DEVICE], row[BYTES], row[REQUIRES_GRAD], row[IS_PARAM])


def _tensor_looks(tensor: Any, parameter_type: Optional[type]) -> Optional[Looks]:
    """What python.tensors shows of a tensor, from its metadata alone (as state.py reads it)."""
    try:
        return (
            str(list(tensor.shape)),
            str(tensor.dtype).replace("torch.", ""),
            str(tensor.device),
            tensor.nelement() * tensor.element_size(),
            bool(tensor.requires_grad),
            parameter_type is not None and isinstance(tensor, parameter_type),
        )
    except Exception:  # noqa: BLE001 - sparse, nested or fake tensors
        return None


def with_holders(
    rows: List[Tuple[Any, ...]], parameter_type: Optional[type], budget_s: float, pacer: Pacer
) -> Tuple[List[Tuple[Any, ...]], List[str]]:
    """`rows` with a held_by value each (None for named rows and for tensors the walk did not
    reach), and a note where the walk stopped before reaching them all."""
    waiting: Dict[Looks, List[int]] = {}  # what a row shows -> the rows that show it, in order
    for index, row in enumerate(rows):
        if row[NAME] is None and row[KIND] == "tensor":
            waiting.setdefault(_row_looks(row), []).append(index)
    wanted = sum(len(indices) for indices in waiting.values())
    given: Dict[Looks, int] = {}

    def match(tensor: Any) -> Optional[int]:
        looks = _tensor_looks(tensor, parameter_type)
        indices = waiting.get(looks) if looks is not None else None
        if looks is None or indices is None or given.get(looks, 0) >= len(indices):
            return None
        given[looks] = given.get(looks, 0) + 1
        return indices[given[looks] - 1]

    holders = find_holders(match, wanted, budget_s, pacer)
    held: Dict[Any, str] = {index: path for index, (_, path) in holders.found.items()}
    notes = []
    if holders.cut is not None:
        bound = holders.stopped(budget_s)
        notes.append(
            f"python.tensors: held_by left NULL for {wanted - len(held):,} of {wanted:,} tensors with no "
            f"name: the walk from the job's variables stopped ({bound}; `query --scan-budget S` raises it)"
        )
    return [row + (held.get(index),) for index, row in enumerate(rows)], notes
