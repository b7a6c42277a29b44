"""The wire format: the one package both the CLI and the agent import.

frames (framing, reading within bounds, sending), messages (requests, replies, error kinds),
tables (typed columns in the payload), texts (long texts in the payload), and records, auth,
sealed, endpoints for records and TCP. Import a name from the submodule that defines it
(`from probing.protocol.frames import send_frame`): this package loads none of them, so the
agent's server, which takes only the error kinds when it starts, defers the rest to its first
connection.

Runs inside the target: standard library only, Python 3.8 syntax.
"""

from __future__ import annotations
