"""A command over a thousand ranks holds a descriptor per rank it asks directly (PROBING_RELAY=0,
or ranks their relay could not reach): at 1 024 ranks the CLI crashed with "filedescriptor out
of range in select()" (measured, benchmarks/scale). Waiting for a reply works on any descriptor,
and a big fan-out raises the soft limit on open files toward the hard one."""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys

import pytest

import probing
from probing.client.connection import Client


def test_a_reply_is_seen_on_a_descriptor_past_what_select_takes() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 2100:
        pytest.skip(f"the hard limit on open files is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2100), hard))
    ours, theirs = socket.socketpair()
    high = socket.socket(fileno=os.dup2(ours.fileno(), 2048))
    try:
        client = Client.__new__(Client)
        client._sock = high  # type: ignore[assignment]
        assert not client.answered(0.05)
        theirs.send(b"x")
        assert client.answered(1.0)
    finally:
        for each in (high, ours, theirs):
            each.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_fan_out_over_many_ranks_raises_the_soft_limit_up_to_the_hard_one() -> None:
    script = (
        "import resource\n"
        "from probing.engine.jobs.fanout import _enough_descriptors\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))\n"
        "_enough_descriptors(1024)\n"
        "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard)\n"
    )
    tested = os.path.dirname(os.path.dirname(probing.__file__))  # the probing under test, not another
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                            env=dict(os.environ, PYTHONPATH=tested))  # fmt: skip
    assert result.returncode == 0, result.stderr
    soft, hard = (int(value) for value in result.stdout.split())
    assert soft == (2 * 1024 + 256 if hard == resource.RLIM_INFINITY else min(2 * 1024 + 256, hard))
