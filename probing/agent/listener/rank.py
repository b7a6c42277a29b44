"""Who this process is in a torchrun job, from its environment: what `hello` says of it. Kept
apart from registry.py so that `hello` loads nothing of the store or the listener."""

from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Optional


def env_number(text: Optional[str]) -> Optional[int]:
    return int(text) if text is not None and text.strip().isdecimal() else None


def rank_identity(environ: Optional[Mapping[str, str]] = None) -> Optional[Dict[str, Any]]:
    """Who this process is in a torchrun job (its environment), or None when it is no rank."""
    env = os.environ if environ is None else environ
    if env_number(env.get("RANK")) is None:
        return None
    return {
        "rank": env_number(env.get("RANK")),
        "local_rank": env_number(env.get("LOCAL_RANK")),
        "group_rank": env_number(env.get("GROUP_RANK")),
        "world_size": env_number(env.get("WORLD_SIZE")),
        "local_world_size": env_number(env.get("LOCAL_WORLD_SIZE")),
        "run_id": env.get("TORCHELASTIC_RUN_ID"),
    }
