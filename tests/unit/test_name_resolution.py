"""The rules by which eval and repl read names __main__ lacks from the job's frames, checked
in-process on real threads (probing/agent/evaluate/framenames.py, framelocals.py)."""

from __future__ import annotations

import gc
import sys
import threading
import weakref
from typing import Any, Callable, Dict, Iterator, List

import pytest

from probing.agent.evaluate import framelocals
from probing.agent.evaluate.evaluation import frame_namespace
from probing.agent.evaluate.framenames import AmbiguousName, FrameNames, frames_for, names_in_code
from probing.agent.evaluate.namespace import EvalNamespace


class Parked:
    """A thread parked inside `function(*args)` until the test ends."""

    def __init__(self, name: str, function: Callable[..., None], *args: Any) -> None:
        self.ready = threading.Event()
        self.go = threading.Event()
        self.thread = threading.Thread(target=function, args=(self, *args), name=name, daemon=True)
        self.thread.start()
        assert self.ready.wait(10)

    def park(self) -> None:
        self.ready.set()
        assert self.go.wait(30)

    def release(self) -> None:
        self.go.set()
        self.thread.join(10)


@pytest.fixture
def parked() -> Iterator[List[Parked]]:
    threads: List[Parked] = []
    yield threads
    for thread in threads:
        thread.release()


def train(parked: Parked, loss: Any) -> None:
    batch = "train batch"  # noqa: F841 - read from the frame
    parked.park()


def evaluate_loop(parked: Parked, loss: Any) -> None:
    parked.park()


def frames(own: Any = None) -> FrameNames:
    names = FrameNames(own if own is not None else {threading.get_ident()})
    notes: List[str] = []
    names.start(notes.append)
    names.notes = notes  # type: ignore[attr-defined]
    return names


def test_one_frame_holding_the_name_gives_its_value_and_says_where(parked: List[Parked]) -> None:
    parked.append(Parked("trainer", train, 2.5))
    names = frames()
    assert names.value("loss") == 2.5
    line = train.__code__.co_firstlineno + 2
    assert names.notes == [f"probing: loss: local of train() at test_name_resolution.py:{line}, trainer\n"]  # type: ignore[attr-defined]


def test_frames_holding_the_same_object_are_one_candidate(parked: List[Parked]) -> None:
    shared = object()
    parked.append(Parked("trainer", train, shared))
    parked.append(Parked("evaluator", evaluate_loop, shared))
    names = frames()
    assert names.value("loss") is shared
    assert "(the same object in 1 more frame)" in names.notes[0]  # type: ignore[attr-defined]


def test_equal_but_distinct_values_are_different_values(parked: List[Parked]) -> None:
    parked.append(Parked("trainer", train, [1]))
    parked.append(Parked("evaluator", evaluate_loop, [1]))
    with pytest.raises(AmbiguousName) as raised:
        frames().value("loss")
    message = str(raised.value)
    assert "name 'loss' is not in __main__, and 2 frames hold different values under it; pick one" in message
    assert "--frame trainer:train" in message and "--frame evaluator:evaluate_loop" in message


def test_different_values_stop_the_code_before_it_runs(parked: List[Parked]) -> None:
    parked.append(Parked("trainer", train, 1.0))
    parked.append(Parked("evaluator", evaluate_loop, 2.0))
    code = compile("print(loss)", "<test>", "exec")
    with pytest.raises(AmbiguousName):
        frames_for({threading.get_ident()}, {}.__contains__, [code])
    # A name the code binds before reading it is not checked up front: it may never need a frame.
    assert frames_for({threading.get_ident()}, {}.__contains__, [compile("loss = 1\nloss", "<t>", "exec")])


def test_the_main_threads_frames_come_first(parked: List[Parked]) -> None:
    """The test runs in the main thread: its own `loss` is seen before the worker's."""
    loss = "in the main thread"
    parked.append(Parked("trainer", train, loss))
    names = frames(own=set())
    assert names.value("loss") == loss
    assert names.notes[0].endswith(", MainThread (the same object in 1 more frame)\n")  # type: ignore[attr-defined]


def test_a_name_only_another_thread_holds_is_found_there(parked: List[Parked]) -> None:
    parked.append(Parked("trainer", train, 1.0))
    names = frames()
    assert names.value("batch") == "train batch"
    assert names.notes[0].endswith(", trainer\n")  # type: ignore[attr-defined]


def test_the_agents_own_threads_are_never_searched(parked: List[Parked]) -> None:
    parked.append(Parked("trainer", train, 1.0))
    names = frames(own={threading.get_ident(), parked[0].thread.ident})
    with pytest.raises(KeyError):
        names.value("loss")


def test_frame_picks_its_frame_and_gives_a_copy_of_its_locals(parked: List[Parked]) -> None:
    parked.append(Parked("trainer", train, 1.0))
    parked.append(Parked("evaluator", evaluate_loop, 2.0))
    globals_, locals_ = frame_namespace({threading.get_ident()}, "evaluator:evaluate_loop")
    assert locals_["loss"] == 2.0 and globals_ is globals()
    exec("loss = 99", globals_, locals_)
    again = frame_namespace({threading.get_ident()}, "evaluator:evaluate_loop")[1]
    assert again["loss"] == 2.0  # the frame's own local is untouched


def test_an_assignment_to_a_name_read_from_a_frame_stays_in_the_eval(parked: List[Parked]) -> None:
    parked.append(Parked("trainer", train, 2.5))
    main: Dict[str, Any] = {"__name__": "__main__"}
    names = frames()
    namespace = EvalNamespace(main, names)
    exec(compile("loss = loss * 2\nseen = loss", "<test>", "exec"), namespace)
    assert namespace["seen"] == 5.0 and main["seen"] == 5.0  # other assignments go to __main__
    assert "loss" not in main
    assert "assigned after it was read from a frame" in names.notes[1]  # type: ignore[attr-defined]
    assert FrameNames({threading.get_ident()}).value("loss") == 2.5


def test_a_new_name_a_frame_holds_stays_out_of_main(parked: List[Parked]) -> None:
    parked.append(Parked("trainer", train, 2.5))
    main: Dict[str, Any] = {"__name__": "__main__"}
    names = frames()
    exec(compile("loss = 3\nstep = 1", "<test>", "exec"), EvalNamespace(main, names))
    assert main == {"__name__": "__main__", "step": 1}
    assert "the new value stays in this eval, not __main__" in names.notes[0]  # type: ignore[attr-defined]


def test_a_new_name_bound_to_the_object_the_frame_holds_goes_to_main_quietly(parked: List[Parked]) -> None:
    """`import torch.distributed as dist` where train() has its own `dist`: nothing is hidden."""
    shared = object()
    parked.append(Parked("trainer", train, shared))
    main: Dict[str, Any] = {"__name__": "__main__", "shared": shared}
    names = frames()
    exec(compile("loss = shared\nprint(loss)", "<test>", "exec"), EvalNamespace(main, names))
    assert main["loss"] is shared and names.notes == []  # type: ignore[attr-defined]


def test_no_frame_holding_the_name_is_a_name_error_with_similar_names(parked: List[Parked]) -> None:
    parked.append(Parked("trainer", train, 2.5))
    names = frames()
    namespace = EvalNamespace({"__name__": "__main__"}, names)
    with pytest.raises(NameError) as raised:
        exec(compile("los", "<test>", "exec"), namespace)
    assert str(raised.value).startswith(
        "name 'los' is not defined. Did you mean: 'loss' (local of train() at"
    )
    with pytest.raises(NameError) as raised:
        exec(compile("zzz_nothing_like_it", "<test>", "exec"), namespace)
    assert str(raised.value) == "name 'zzz_nothing_like_it' is not defined"


def test_code_naming_only_main_and_builtins_walks_no_stack() -> None:
    main = {"model": 1}
    assert frames_for(set(), main.__contains__, [compile("print(len([model]))", "<t>", "exec")]) is None
    assert frames_for(set(), main.__contains__, [compile("model = 2", "<t>", "exec")]) is None


def test_names_in_code_sees_nested_functions_and_comprehensions() -> None:
    code = compile("def f():\n    return loss\nx = [batch * i for i in range(2)]\ndel y", "<t>", "exec")
    loads, stores = names_in_code(code)
    assert {"loss", "batch", "range"} <= loads and {"f", "x", "y"} <= stores and "i" not in loads


def test_reading_a_frame_keeps_nothing_alive() -> None:
    """f_locals on 3.8-3.12 would leave a copy of the locals in the frame, keeping `value` alive
    after the job dropped it: the reader must not."""

    class Payload:
        pass

    held, read, dropped, finish = (threading.Event() for _ in range(4))

    def hold(box: List[Any]) -> None:
        value = box.pop()
        held.set()
        read.wait(10)
        del value  # what the job does next: the object must go now
        dropped.set()
        finish.wait(10)

    payload = Payload()
    gone = weakref.ref(payload)
    thread = threading.Thread(target=hold, args=([payload],), daemon=True)
    thread.start()
    del payload
    assert held.wait(10)
    frame = sys._current_frames()[thread.ident]  # type: ignore[index]
    while frame.f_code.co_name != "hold":
        frame = frame.f_back  # type: ignore[assignment]
    found, value = framelocals.read(frame, "value")
    assert found and value is gone()
    del value, frame
    read.set()
    assert dropped.wait(10)
    gc.collect()
    try:
        assert gone() is None
    finally:
        finish.set()
        thread.join(10)


def test_the_frame_layout_of_this_python_is_readable() -> None:
    assert framelocals.can_read()


def test_an_assignment_in_a_loop_is_said_once(parked: List[Parked]) -> None:
    parked.append(Parked("trainer", train, 2.5))
    names = frames()
    namespace = EvalNamespace({"__name__": "__main__"}, names)
    # A loop variable no other thread of the test process holds (threads other tests left, such
    # as a scripted agent's, have a `_` of their own).
    exec(compile("for round_of_this_test in range(3):\n    loss = loss + 1", "<test>", "exec"), namespace)
    assert namespace["loss"] == 5.5
    assert len(names.notes) == 2  # type: ignore[attr-defined]


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the data-stack reader is 3.11's")
def test_the_311_reader_keeps_the_gil_from_its_check_to_its_read() -> None:
    """3.11 hands the GIL over only at calls, function starts and backward jumps: none may come
    between reading where the frame is and taking the slot's object."""
    import dis

    instructions = list(dis.get_instructions(framelocals._slot_of_data_stack))
    start = next(
        i for i, ins in enumerate(instructions) if ins.opname == "STORE_FAST" and ins.argval == "base"
    )
    used = {ins.opname for ins in instructions[start - 2 :]}
    assert not {name for name in used if "CALL" in name or "BACKWARD" in name or name == "RESUME"}, used
