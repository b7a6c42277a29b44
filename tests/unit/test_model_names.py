"""The name a model or optimizer is shown under (agent/pytorch/discovery.py `names_of`): the
job's own variable, in this process, with plain objects standing for torch's."""

from __future__ import annotations

import sys
import threading
import types

import pytest

from probing.agent.pytorch import discovery


class Model:
    """Stands for an nn.Module whose forward a training thread is inside of."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.released = threading.Event()

    def __call__(self) -> None:
        self.entered.set()
        self.released.wait(10)


class Trainer:
    def __init__(self) -> None:
        self.model = Model()


def test_a_model_is_named_by_the_jobs_variable_not_by_the_self_of_the_call_a_thread_is_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`trainer.model` in __main__, while the training thread is inside `trainer.model(batch)`:
    torch's Module.__call__ frame has the model as `self`, a name the job never wrote, and one
    that a query caught only mid-forward (hostile/test_tensor_leaks_named.py under load)."""
    job_main = types.ModuleType("__main__")
    job_main.trainer = Trainer()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "__main__", job_main)
    model = job_main.trainer.model  # type: ignore[attr-defined]
    training = threading.Thread(target=model, name="train")
    training.start()
    try:
        assert model.entered.wait(10)
        names = discovery.names_of([model], own_threads={threading.get_ident()})
    finally:
        model.released.set()
        training.join(10)
    assert names[id(model)] == "trainer.model"


def test_a_variable_that_holds_the_model_itself_comes_before_an_attribute_in_the_same_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    job_main = types.ModuleType("__main__")
    job_main.trainer = Trainer()  # type: ignore[attr-defined]
    job_main.net = job_main.trainer.model  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "__main__", job_main)
    names = discovery.names_of([job_main.net], own_threads={threading.get_ident()})  # type: ignore[attr-defined]
    assert names[id(job_main.net)] == "net"  # type: ignore[attr-defined]
