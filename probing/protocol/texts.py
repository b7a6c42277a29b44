"""Texts (what an eval printed, its value, its traceback) carried in a frame's payload.

Runs inside the target: standard library only, Python 3.8 syntax.
"""

from __future__ import annotations

from .frames import FrameError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

    from .frames import ByteChunk


def quoted(value: Any, limit: int = 80) -> str:
    """`value`, something a peer sent, as a message of ours quotes it: its repr, at most `limit`
    characters and a few levels deep. A hostile job's names and values may be megabytes, or
    nested as deep as the JSON reader allows, and the message is one line a person reads."""
    import reprlib

    shown = reprlib.Repr()
    shown.maxlevel, shown.maxstring, shown.maxother = 3, limit, limit
    text = shown.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def encode_texts(texts: Dict[str, Optional[str]]) -> Tuple[Dict[str, Any], List[ByteChunk]]:
    """Texts (what an eval printed, its value, its traceback) as UTF-8 in the payload.

    Returns ({name: [offset, length] or None}, chunks). Output travels outside the JSON
    header because the header is capped (MAX_HEADER_BYTES) and JSON escapes every non-ASCII
    character to six bytes: 1.1 MB of print() output used to fail the whole command.
    """
    layout: Dict[str, Any] = {}
    chunks: List[ByteChunk] = []
    offset = 0
    for name, text in texts.items():
        if text is None:
            layout[name] = None
            continue
        # A lone surrogate (from a bad decode in the job) must not fail the reply.
        data = text.encode("utf-8", "backslashreplace")
        layout[name] = [offset, len(data)]
        if data:
            chunks.append(data)
        offset += len(data)
    return layout, chunks


def decode_texts(layout: Any, payload: ByteChunk) -> Dict[str, Optional[str]]:
    """Inverse of `encode_texts`; raises FrameError on a layout that does not fit the payload."""
    if not isinstance(layout, dict):
        raise FrameError("reply texts are not an object", fatal=False)
    view = memoryview(payload)
    texts: Dict[str, Optional[str]] = {}
    for name, place in layout.items():
        if place is None:
            texts[name] = None
            continue
        if (
            not isinstance(place, list)
            or len(place) != 2
            or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in place)
            or place[0] + place[1] > len(view)
        ):
            raise FrameError(f"reply text {quoted(name)} does not fit the payload", fatal=False)
        texts[name] = bytes(view[place[0] : place[0] + place[1]]).decode("utf-8", "replace")
    return texts
