"""What holds a tensor, written as the job would write it (agent/memory/holders.py), and which
storages grew between two censuses (agent/memory/storages.py): in this process, with real torch
on CPU. The walk runs no code of the job's objects, and stops at its bounds with a reason."""

from __future__ import annotations

import collections
import gc
import sys
import types
from typing import Any, Dict, Iterator, Tuple

import pytest

from probing.agent.memory import holders, storages, tensor_growth, tensor_names
from probing.agent.memory.census import take_census
from probing.agent.pacing import Pacer

torch = pytest.importorskip("torch")

# The longest one listing of a gc generation may take in the censuses these tests need whole.
# By default a 5 s budget allows 50 ms, and listing this process's oldest generation was
# estimated at 72 ms beside the suite's other workers: the census left it out, and the tests
# that compare two whole censuses compared a partial one.
EVERY_GENERATION = 10.0


class Trainer:
    def __init__(self) -> None:
        self.cache = {"embeddings": torch.zeros(64)}
        self.model = torch.nn.Sequential(torch.nn.Linear(3, 4))


class Slotted:
    __slots__ = ("kept",)

    def __init__(self) -> None:
        self.kept = torch.ones(5)


class Trap:
    """Any of the job's own code running during the walk is a failure."""

    def __init__(self) -> None:
        self.inside = torch.ones(6)

    def __getattr__(self, name: str) -> Any:
        raise AssertionError("the walk ran the job's __getattr__")

    def __iter__(self) -> Iterator[Any]:
        raise AssertionError("the walk ran the job's __iter__")


class TrapList(list):  # type: ignore[type-arg]
    def __iter__(self) -> Iterator[Any]:
        raise AssertionError("the walk ran the job's list __iter__")

    def __len__(self) -> int:
        raise AssertionError("the walk ran the job's list __len__")


Pair = collections.namedtuple("Pair", "step output")


@pytest.fixture
def job() -> Iterator[Dict[str, Any]]:
    """The namespace of a module of the job's own (its file outside site-packages and the
    standard library)."""
    module = types.ModuleType("jobmodule")
    module.__file__ = "/srv/job/jobmodule.py"
    namespace: Dict[str, Any] = vars(module)
    namespace.update(
        history=[torch.randn(3) for _ in range(20)],
        trainer=Trainer(),
        slotted=Slotted(),
        pair=Pair(7, torch.ones(2)),
        queue=collections.deque([torch.ones(7)]),
        trap=Trap(),
        traps=TrapList([torch.ones(8)]),
    )
    sys.modules["jobmodule"] = module
    try:
        yield namespace
    finally:
        del sys.modules["jobmodule"]


def paths_of(wanted: Dict[int, str], budget_s: float = 5.0) -> holders.Holders:
    return holders.find_holders(lambda tensor: wanted.get(id(tensor)), len(wanted), budget_s, Pacer())


def test_every_kind_of_holder_is_named_as_the_job_would_write_it(job: Dict[str, Any]) -> None:
    local_batch = torch.ones(9)
    wanted = {
        id(job["history"][17]): "list item",
        id(job["trainer"].cache["embeddings"]): "dict value of an attribute",
        id(job["trainer"].model[0].weight): "a parameter of a model",
        id(job["slotted"].kept): "a slot",
        id(job["pair"].output): "a namedtuple's field",
        id(job["queue"][0]): "a deque's item",
        id(job["trap"].inside): "an attribute of a class with __getattr__",
        id(job["traps"][0]): "an item of a list subclass",
        id(local_batch): "a local of this frame",
    }
    found = paths_of(wanted).found
    assert found == {
        "list item": ("jobmodule.history", "jobmodule.history[17]"),
        "dict value of an attribute": ("jobmodule.trainer.cache", "jobmodule.trainer.cache['embeddings']"),
        "a parameter of a model": ("jobmodule.trainer.model.0", "jobmodule.trainer.model.0.weight"),
        "a slot": ("jobmodule.slotted", "jobmodule.slotted.kept"),
        "a namedtuple's field": ("jobmodule.pair", "jobmodule.pair.output"),
        "a deque's item": ("jobmodule.queue", "jobmodule.queue[0]"),
        "an attribute of a class with __getattr__": ("jobmodule.trap", "jobmodule.trap.inside"),
        "an item of a list subclass": ("jobmodule.traps", "jobmodule.traps[0]"),
        "a local of this frame": (
            "test_every_kind_of_holder_is_named_as_the_job_would_write_it.<locals>",
            "test_every_kind_of_holder_is_named_as_the_job_would_write_it.<locals>.local_batch",
        ),
    }


def test_a_walk_out_of_time_says_so_and_names_what_it_found(job: Dict[str, Any]) -> None:
    unreachable = {id(torch.ones(1)): "dropped at once"}  # nothing holds it: the walk looks everywhere
    cut = paths_of(unreachable, budget_s=0.0)
    assert cut.cut == "time" and cut.found == {}
    whole = paths_of(unreachable)
    assert whole.cut != "time" and whole.found == {} and whole.looked > len(job["history"])


def test_a_big_container_is_walked_in_slices(job: Dict[str, Any]) -> None:
    job["many"] = [torch.zeros(1) for _ in range(3 * holders.CHUNK + 5)]
    job["keyed"] = {f"step{index}": tensor for index, tensor in enumerate(job["many"])}
    found = paths_of({id(job["many"][-1]): "last"}).found
    assert found["last"] == ("jobmodule.many", f"jobmodule.many[{3 * holders.CHUNK + 4}]")
    del job["many"]
    found = paths_of({id(job["keyed"][f"step{3 * holders.CHUNK + 4}"]): "last"}).found
    assert found["last"] == ("jobmodule.keyed", f"jobmodule.keyed['step{3 * holders.CHUNK + 4}']")


def test_views_share_one_storage_and_a_new_storage_is_known_by_its_key() -> None:
    base = torch.zeros(100)
    view = base[10:20]
    base_extent, view_extent = storages.storage_extent(base), storages.storage_extent(view)
    assert base_extent is not None and view_extent is not None
    assert base_extent[0] == view_extent[0] and base_extent[1] == 400 and view_extent[1] == 80
    assert storages.device_of(base_extent[0]) == "cpu"
    before = take_census(5.0, bound_s=EVERY_GENERATION)
    grown = [torch.zeros(1000) for _ in range(3)]
    after = take_census(5.0, bound_s=EVERY_GENERATION)
    new = {key: size for key, size in after.storages.items() if key not in before.storages}
    keys = {extent[0] for extent in map(storages.storage_extent, grown) if extent is not None}
    assert len(keys) == len(grown)
    assert keys <= set(new) and all(new[key] == 4000 for key in keys)


def test_a_storage_census_is_no_growth_of_the_job() -> None:
    """The storages a census keeps are ints in dicts gc does not track: a second census counts
    none of the first one's."""
    kept = torch.zeros(10)
    census = take_census(5.0)
    assert census.storages and not gc.is_tracked(census.storages)
    del kept


def test_python_tensors_rows_with_no_name_get_what_holds_them(job: Dict[str, Any]) -> None:
    """Rows as pytorch/state.py makes them (metadata only): the unnamed ones get a path, matched
    by what the row shows; named rows and tensors nothing reachable holds get none."""

    def row(tensor: Any, name: Any, kind: str) -> Tuple[Any, ...]:
        return (
            name, kind, str(list(tensor.shape)), str(tensor.dtype).replace("torch.", ""), str(tensor.device),
            tensor.nelement() * tensor.element_size(), tensor.requires_grad,
            isinstance(tensor, torch.nn.Parameter), None,
        )  # fmt: skip

    weight = job["trainer"].model[0].weight
    rows = [
        row(weight, "model.0.weight", "parameter"),
        row(job["trainer"].cache["embeddings"], None, "tensor"),
        row(torch.zeros(11, 13), None, "tensor"),  # dropped at once: nothing holds it
        *[row(tensor, None, "tensor") for tensor in job["history"]],
    ]
    named, notes = tensor_names.with_holders(rows, torch.nn.Parameter, 5.0, Pacer())
    assert [len(row) for row in named] == [len(rows[0]) + 1] * len(rows) and notes == []
    held_by = [row[-1] for row in named]
    assert held_by[:3] == [None, "jobmodule.trainer.cache['embeddings']", None]
    # The history's twenty tensors read alike: each of their rows gets one of their paths.
    assert sorted(held_by[3:]) == sorted(f"jobmodule.history[{index}]" for index in range(20))


def test_python_tensors_says_when_the_walk_left_holders_unnamed(job: Dict[str, Any]) -> None:
    rows = [(None, "tensor", "[3]", "float32", "cpu", 12, False, False, None)]
    named, notes = tensor_names.with_holders(rows, torch.nn.Parameter, 0.0, Pacer())
    assert named[0][-1] is None
    assert notes == [
        "python.tensors: held_by left NULL for 1 of 1 tensors with no name: the walk from the job's "
        "variables stopped (its 0 s ran out; `query --scan-budget S` raises it)"
    ]


def test_tensor_growth_is_not_measured_from_a_census_that_left_a_generation_out() -> None:
    """A storage the first census did not reach would count as new: the growth says why it is
    not measured, and the budget that would let it be."""
    complete = take_census(5.0, bound_s=EVERY_GENERATION)
    partial = take_census(5.0, bound_s=0.0)  # no generation may be listed
    assert partial.skipped
    result, _ = tensor_growth.tensor_growth(partial, complete, {}, 5.0, 5, Pacer())
    assert result["sites"] == [] and result["unmeasured"].startswith(
        "the census before the window did not list gc's generation 0"
    )
    assert "--scan-budget" in result["unmeasured"]
    result, _ = tensor_growth.tensor_growth(complete, partial, {}, 5.0, 5, Pacer())
    assert result["unmeasured"].startswith("the census after the window did not list")
