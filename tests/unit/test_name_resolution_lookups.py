"""The interpreter's own lookups through an eval's namespace (review-b finding 7)."""

from __future__ import annotations

import threading
from typing import Any, Dict, List

from probing.agent.evaluate.framenames import FrameNames
from probing.agent.evaluate.namespace import EvalNamespace


def test_an_annotation_sets_up_annotations_in_a_main_that_has_none() -> None:
    # SETUP_ANNOTATIONS looks `__annotations__` up and creates it on KeyError: a NameError
    # from the frames' lookup stopped the eval instead.
    main: Dict[str, Any] = {"__name__": "__main__"}
    names = FrameNames({threading.get_ident()})
    said: List[str] = []
    names.start(said.append)
    exec(compile("x: int = 1\nprint(x)", "<test>", "exec"), EvalNamespace(main, names))
    assert main["x"] == 1 and list(main["__annotations__"]) == ["x"]
