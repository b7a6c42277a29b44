"""The click-free parser for plain `probing [GLOBAL OPTIONS] TARGET backtrace [OPTIONS]`.

It accepts only what click would accept with the same meaning; anything else (help, an
error, another command) returns None and goes to click. tests/unit/test_cli.py checks that both
parsers agree.
"""

from __future__ import annotations

import os

from .spec import BACKTRACE_OPTIONS, GLOBAL_OPTIONS, Option, names_target

# No typing at run time: this is the Python CLI's backtrace path (CONTRIBUTING.md, "Imports").
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Sequence


def looks_like_target(text: str) -> bool:
    return text.isdigit() or (os.sep in text and os.path.exists(text))


def _by_name(options: Sequence[Option]) -> Dict[str, Option]:
    table = {option.name: option for option in options}
    table.update({option.short: option for option in options if option.short})
    return table


_GLOBAL = _by_name(GLOBAL_OPTIONS)
_BACKTRACE = _by_name(BACKTRACE_OPTIONS)


def _convert(option: Option, text: str) -> Any:
    if option.choices is not None and text not in option.choices:
        raise ValueError(text)
    value = option.value_type(text)
    if option.value_type is float and not value > 0:
        raise ValueError(text)
    return value


def _option(args: List[str], index: int, table: Dict[str, Option], found: Dict[str, Any]) -> int:
    """Read the option at args[index] into `found`; the index after it, or -1 if not understood."""
    name, has_value, value = args[index].partition("=")
    option = table.get(name)
    if option is None or (has_value and (option.flag or not name.startswith("--"))):
        return -1
    if option.flag:
        found[option.dest] = True
        return index + 1
    if not has_value:
        index += 1
        if index >= len(args):
            return -1
        value = args[index]
    try:
        found[option.dest] = _convert(option, value)
    except ValueError:
        return -1
    return index + 1


def parse_backtrace(args: List[str]) -> Optional[Dict[str, Any]]:
    """Parameters of a plain backtrace command line, or None to let click parse it."""
    found: Dict[str, Any] = {"target": None}
    found.update({option.dest: option.default for option in GLOBAL_OPTIONS})
    index = 0
    # Global options and the target, up to the command word.
    while index < len(args):
        arg = args[index]
        if names_target(arg):
            if found["target"] is not None:
                return None
            if "=" in arg:
                found["target"] = arg.split("=", 1)[1]
            elif index + 1 < len(args):
                index += 1
                found["target"] = args[index]
            else:
                return None
            index += 1
        elif arg.startswith("-"):
            index = _option(args, index, _GLOBAL, found)
            if index < 0:
                return None
        elif found["target"] is None and arg != "backtrace":
            found["target"] = arg
            index += 1
        else:
            break
    if index >= len(args) or args[index] != "backtrace" or found["target"] is None:
        return None
    if not looks_like_target(found["target"]):
        return None
    found.update({option.dest: option.default for option in BACKTRACE_OPTIONS})
    index += 1
    while index < len(args):
        index = _option(args, index, _BACKTRACE, found)
        if index < 0:
            return None
    return found
