"""Which command lines are torchrun's launcher, whose agent must not listen (issue 14 review #5)."""

from __future__ import annotations

from typing import List, Optional

import pytest

from probing.agent.listener.launcher import launcher_program


@pytest.mark.parametrize(
    ("argv", "launcher"),
    [
        (["/usr/bin/python3", "/venv/bin/torchrun", "--nproc-per-node=2", "train.py"], "/venv/bin/torchrun"),
        (["python", "-m", "torch.distributed.run", "train.py"], "torch.distributed.run"),
        (["python", "-mtorch.distributed.launch", "train.py"], "torch.distributed.launch"),
        (["python", "-X", "dev", "-u", "-m", "torch.distributed.run"], "torch.distributed.run"),
        (["python", "/venv/torch/distributed/run.py"], "/venv/torch/distributed/run.py"),
        (["/venv/bin/torchrun", "train.py"], "/venv/bin/torchrun"),
        (["python", "train.py", "torchrun"], None),
        (["python", "-m", "pytest", "torchrun"], None),
        (["python", "-c", "import torchrun"], None),
        (["python", "-W", "torchrun", "train.py"], None),
        (["python"], None),
    ],
)  # fmt: skip
def test_the_launcher_is_told_by_its_script_or_module(argv: List[str], launcher: Optional[str]) -> None:
    assert launcher_program(argv) == launcher
