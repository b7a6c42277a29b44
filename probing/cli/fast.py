"""The click-free parser for plain `probing [-v] TARGET backtrace [OPTIONS]` command lines.

It accepts only what click would accept with the same meaning; anything else (help, an
error, another command) returns None and goes to click. tests/test_cli_fast.py checks that
both parsers agree.
"""

from __future__ import annotations

import os

from .spec import BACKTRACE_OPTIONS, GLOBAL_FLAGS, TARGET_OPTIONS, Option

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional

_BY_NAME = {option.name: option for option in BACKTRACE_OPTIONS}


def looks_like_target(text: str) -> bool:
    return text.isdigit() or (os.sep in text and os.path.exists(text))


def _convert(option: Option, text: str) -> Any:
    if option.choices is not None and text not in option.choices:
        raise ValueError(text)
    value = option.value_type(text)
    if option.value_type is float and not value > 0:
        raise ValueError(text)
    return value


def parse_backtrace(args: List[str]) -> Optional[Dict[str, Any]]:
    """Parameters of a plain backtrace command line, or None to let click parse it."""
    found: Dict[str, Any] = {"target": None, "verbose": False}
    index = 0
    # Global options and the target, up to the command word.
    while index < len(args):
        arg = args[index]
        if arg in GLOBAL_FLAGS:
            found[GLOBAL_FLAGS[arg]] = True
        elif arg in TARGET_OPTIONS or arg.startswith("--target="):
            if found["target"] is not None:
                return None
            if "=" in arg:
                found["target"] = arg.split("=", 1)[1]
            elif index + 1 < len(args):
                index += 1
                found["target"] = args[index]
            else:
                return None
        elif arg.startswith("-"):
            return None
        elif found["target"] is None and arg != "backtrace":
            found["target"] = arg
        else:
            break
        index += 1
    if index >= len(args) or args[index] != "backtrace" or found["target"] is None:
        return None
    if not looks_like_target(found["target"]):
        return None
    options: Dict[str, Any] = {option.dest: option.default for option in BACKTRACE_OPTIONS}
    rest = args[index + 1 :]
    position = 0
    while position < len(rest):
        name, has_value, value = rest[position].partition("=")
        option = _BY_NAME.get(name)
        if option is None:
            return None
        if option.flag:
            if has_value:
                return None
            options[option.dest] = True
        else:
            if not has_value:
                position += 1
                if position >= len(rest):
                    return None
                value = rest[position]
            try:
                options[option.dest] = _convert(option, value)
            except ValueError:
                return None
        position += 1
    found.update(options)
    return found
