"""The agent's columnar ring buffer: bounded, NULL-aware, shipped without joining its blocks."""

from __future__ import annotations

import threading

from probing.agent.ring import Ring
from probing.protocol.tables import decode_table

COLUMNS = [
    ("step", "BIGINT"),
    ("name", "VARCHAR"),
    ("duration", "DOUBLE"),
    ("memory", "DOUBLE"),
    ("ok", "BOOLEAN"),
]


def decoded(ring: Ring) -> list:  # type: ignore[type-arg]
    descriptor, chunks = ring.encode()
    return decode_table(descriptor, bytearray(b"".join(bytes(chunk) for chunk in chunks))).to_rows()


def test_rows_come_back_with_strings_and_nulls() -> None:
    ring = Ring("t", COLUMNS, 100)
    ring.append((1, ring.code("model.0"), 0.5, None, True))
    ring.append((2, ring.code("model.1"), 0.25, 3.0, None))
    ring.append((3, ring.code("model.0"), 0.125, None, False))
    assert decoded(ring) == [
        {"step": 1, "name": "model.0", "duration": 0.5, "memory": None, "ok": True},
        {"step": 2, "name": "model.1", "duration": 0.25, "memory": 3.0, "ok": None},
        {"step": 3, "name": "model.0", "duration": 0.125, "memory": None, "ok": False},
    ]
    assert ring.words == ["model.0", "model.1"]


def test_a_full_ring_drops_its_oldest_sixteenth() -> None:
    ring = Ring("t", COLUMNS, 160)  # blocks of 10 rows
    for step in range(1000):
        ring.append((step, ring.code(f"m{step % 3}"), float(step), None if step % 2 else 1.0, True))
    rows = decoded(ring)
    assert 150 <= len(rows) <= 160 and len(ring) == len(rows)
    assert [row["step"] for row in rows] == list(range(1000 - len(rows), 1000))
    assert ring.dropped == 1000 - len(rows)
    assert all(row["memory"] == (None if row["step"] % 2 else 1.0) for row in rows)


def test_encoding_while_another_thread_appends_never_tears_a_row() -> None:
    ring = Ring("t", COLUMNS, 50_000)
    stop = threading.Event()

    def writer() -> None:
        step = 0
        while not stop.is_set():
            ring.append((step, ring.code("w"), float(step), float(step), True))
            step += 1

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for _ in range(20):
            rows = decoded(ring)
            assert all(row["duration"] == row["step"] == row["memory"] for row in rows)
            steps = [row["step"] for row in rows]
            assert steps == list(range(steps[0], steps[0] + len(steps))) if steps else True
    finally:
        stop.set()
        thread.join()
