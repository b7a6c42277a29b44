"""The agent uses a module of the job only once the job has finished importing it
(agent/imported.py): attached in the middle of `import torch`, `trace on` said "the agent failed:
AttributeError: partially initialized module 'torch' has no attribute 'compiler'". The state under
test is importlib's own: a module in sys.modules whose spec is marked `_initializing` while its
code runs; here a real module imported by importlib, asked from inside its own import."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from probing.agent.imported import imported, importing
from probing.agent.pytorch.discovery import NoTorch, require_torch


def test_a_module_is_imported_only_once_its_code_has_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "halfway.py").write_text(
        "from probing.agent.imported import imported, importing\n"
        "SEEN = (imported('halfway'), importing('halfway'))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "halfway", raising=False)
    module = importlib.import_module("halfway")
    assert module.SEEN == (None, True)  # asked while its import ran
    assert imported("halfway") is module and not importing("halfway")
    assert imported("no_such_module_anywhere") is None and not importing("no_such_module_anywhere")


def test_torch_halfway_through_its_import_is_said_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in named torch, asking from inside its own import what `trace on` would be told."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(
        "import types\n"
        "nn = types.SimpleNamespace()\n"
        "from probing.agent.pytorch.discovery import NoTorch, require_torch\n"
        "try:\n"
        "    require_torch()\n"
        "except NoTorch as error:\n"
        "    TOLD = str(error)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [name for name in sys.modules if name == "torch" or name.startswith("torch.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torch.optim.optimizer", object())
    stand_in = importlib.import_module("torch")
    assert stand_in.TOLD == "this process is importing torch right now: ask again once it has"
    assert require_torch() is stand_in  # once its import is done
    monkeypatch.delitem(sys.modules, "torch")
    with pytest.raises(NoTorch, match="has not imported torch"):
        require_torch()


def test_the_agent_takes_torch_from_the_job_only_through_imported() -> None:
    """Every place the agent looks for the job's torch goes through `imported`: a lookup of
    sys.modules by hand would see the half-made module again."""
    agent = Path(importlib.import_module("probing.agent").__file__ or "").parent
    by_hand = [
        f"{path.relative_to(agent)}:{number}"
        for path in sorted(agent.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if 'sys.modules.get("torch")' in line
        or "sys.modules['torch']" in line
        or 'sys.modules["torch"]' in line
    ]
    assert by_hand == []
