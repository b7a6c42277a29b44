"""An agent's replies on its Unix socket as the Python CLI decodes them: the frames (client/
replies.py ReplyReader), the reply's shape (check_result, error_from_reply), a table's typed
columns (protocol/tables.py decode_table) and texts (decode_texts), through the real Client.

The fake agent listens in this test process, where the Client looks for this process's agent,
so its checks of the socket and of the peer pass; every connection gets the input's bytes as
the agent's whole side of the conversation (the hello's reply, then the request's)."""

from __future__ import annotations

import os
from typing import Any, List

from agents import FakeAgent
from harness import BYTES, frame_streams, frames, fuzzes
from hypothesis import strategies as st

from probing.client.connection import Client

SCRATCH = st.binary(max_size=512) | frame_streams()


def ask(agent: FakeAgent, data: bytes, method: str) -> Any:
    """What the CLI makes of `data` as the agent's answer to `method` (engine/backtrace.py,
    engine/query.py, engine/requests.py): rows, a description, texts."""
    agent.reply = data
    with Client(agent.path, 5.0, pid=os.getpid()) as client:
        if method == "backtrace":
            from probing.client.replies import decode_reply_table

            result, payload = client.call("backtrace", {"locals": False, "thread": None})
            return decode_reply_table(result, payload).to_rows()
        if method == "table":
            return client.fetch_table("python.threads").to_rows()
        if method == "tables":
            return client.describe_tables()
        from probing.client.replies import decode_reply_texts

        result, payload = client.call("eval", {"code": "1", "frame": None, "timeout": 1.0})
        return decode_reply_texts(result, payload)


@fuzzes("replies", examples=300, mutations=BYTES + (frames(),) * 6, scratch=SCRATCH)
def test_agent_replies_as_the_python_cli_reads_them(fake_agent: FakeAgent, data: bytes) -> List[Any]:
    """Each input is read as the answer to each kind of request the CLI makes."""
    return [ask(fake_agent, data, method) for method in ("backtrace", "table", "tables", "eval")]
