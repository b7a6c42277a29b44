"""Writes front_tables.h: the rules the native front end shares with the Python CLI, taken
from the Python modules themselves at build time, so the two copies cannot drift apart.

    python native/front/gen_tables.py SOURCE_ROOT OUTPUT_HEADER

Every rule is data here: the state rules (analysis/states.py) and the layout's templates
(cli/render/backtrace.py) become tables that states.c and render.c interpret; what those
interpreters do is checked against the Python functions case by case by
tests/integration/test_front_rules.py, and the whole output by the golden corpus
(tests/golden/backtrace, test_front_replies.py).
"""

import string
import sys


def c_string(text: str) -> str:
    """A C string literal of `text`'s UTF-8 bytes: printable ASCII as is, the rest in octal
    (and ? too: no trigraphs)."""
    plain = [
        chr(byte) if 0x20 <= byte < 0x7F and chr(byte) not in '"\\?' else f"\\{byte:03o}"
        for byte in text.encode()
    ]
    return '"' + "".join(plain) + '"'


def strings(name: str, values) -> str:
    body = ", ".join(c_string(value) for value in values)
    return f"static const char *const {name}[] = {{{body}, NULL}};\n"


def template(name: str, text: str, fields: list) -> str:
    """A layout template as pieces: each literal text, then the field written after it (-1:
    none). Fields are numbered in the order first met across every template."""
    pieces = []
    for literal, field, spec, conversion in string.Formatter().parse(text):
        if spec or conversion:
            raise ValueError(f"{name}: only plain fields ({field!r})")
        if field is not None and field not in fields:
            fields.append(field)
        pieces.append(f"{{{c_string(literal)}, {fields.index(field) if field is not None else -1}}}")
    body = ", ".join(pieces)
    return f"static const piece_t {name}[] = {{{body}, {{NULL, -1}}}};\n"


def layout(lines: list) -> None:
    """cli/render/backtrace.py's templates, as render.c fills them."""
    from probing.cli.render import backtrace

    fields: list = []
    lines.append("typedef struct { const char *text; int field; } piece_t;\n")
    names = ("PROCESS_LINE", "THREAD_GAP", "THREAD_LINE", "NUMBERED", "NATIVE_FRAME", "PYTHON_FRAME",
             "CODE_LINE", "NO_THREADS")  # fmt: skip
    for name in names:
        lines.append(template(name, getattr(backtrace, name), fields))
    for index, field in enumerate(fields):
        lines.append(f"#define FIELD_{field.upper()} {index}\n")
    lines.append(f"#define FIELD_COUNT {len(fields)}\n")
    lines.append(f"#define MAIN_THREAD {c_string(backtrace.MAIN_THREAD)}\n")
    lines.append(f"#define UNKNOWN_LINENO {c_string(backtrace.UNKNOWN_LINENO)}\n")


def state_rules(lines: list) -> None:
    """analysis/states.py's rules, as states.c applies them."""
    from probing.analysis import states

    texts = ("WAITING_FOR_THE_GIL", "IN_NATIVE_CODE", "RUNNING_PYTHON", "HOLDS_THE_GIL", "COLLECTIVES_FILE",
             "COLLECTIVE_STATE", "UNNAMED_ADDRESS", "STANDARD_LIBRARY_ROOT")  # fmt: skip
    for name in texts:
        lines.append(f"#define {name} {c_string(getattr(states, name))}\n")
    lines.append(f"#define GIL_WAIT_DEPTH {states.GIL_WAIT_DEPTH}\n")
    lines.append(f"#define LIBRARY_DEPTH {states.LIBRARY_DEPTH}\n")
    lines.append(strings("GIL_WAITS", states.GIL_WAITS))
    # Native function names: one list per meaning, in the order thread_state tries them.
    lines.append(strings("NATIVE_MEANINGS", [meaning for _, meaning in states.NATIVE_CALLS]))
    for index, (names, _) in enumerate(states.NATIVE_CALLS):
        lines.append(strings(f"NATIVE_NAMES_{index}", names))
    groups = ", ".join(f"NATIVE_NAMES_{index}" for index in range(len(states.NATIVE_CALLS)))
    lines.append(f"static const char *const *const NATIVE_NAMES[] = {{{groups}, NULL}};\n")
    lines.append(strings("STANDARD_LIBRARY", states.STANDARD_LIBRARY))
    lines.append(strings("TORCH_LIBRARY", states.TORCH_LIBRARY))
    lines.append(strings("WRAPPERS", states.WRAPPERS))
    nested_file, nested_func, nested_state = states.NESTED_WAIT
    lines.append(f"#define NESTED_WAIT_FILE {c_string(nested_file)}\n")
    lines.append(f"#define NESTED_WAIT_FUNC {c_string(nested_func)}\n")
    lines.append(f"#define NESTED_WAIT_STATE {c_string(nested_state)}\n")
    funcs, meaning = states.INNERMOST_CALLS
    lines.append(strings("INNERMOST_FUNCS", funcs))
    lines.append(f"#define INNERMOST_STATE {c_string(meaning)}\n")
    lines.append("struct call { const char *part; const char *const *funcs; const char *meaning; };\n")
    lines.append(calls("LIBRARY_CALLS", "CALL_FUNCS", states.LIBRARY_CALLS))
    # A line rule: its way of matching (in, starts, with) in `part`, its parts in `funcs`.
    lines.append(calls("LINE_CALLS", "LINE_PARTS", states.LINE_CALLS))
    lines.append("struct with_header { const char *part; const char *before; const char *after; };\n")
    headers = ", ".join(f"{{{c_string(p)}, {c_string(b)}, {c_string(a)}}}" for p, b, a in states.WITH_HEADERS)
    lines.append(f"static const struct with_header WITH_HEADERS[] = {{{headers}, {{NULL, NULL, NULL}}}};\n")


def calls(name: str, lists: str, rows) -> str:
    """(text, words, meaning) rows as a table of struct call; empty words as an empty list."""
    out = []
    for index, (_, words, _) in enumerate(rows):
        out.append(
            strings(f"{lists}_{index}", words)
            if words
            else f"static const char *const {lists}_{index}[] = {{NULL}};\n"
        )
    body = ",\n    ".join(
        f"{{{c_string(text)}, {lists}_{index}, {c_string(meaning)}}}"
        for index, (text, _, meaning) in enumerate(rows)
    )
    out.append(f"static const struct call {name}[] = {{\n    {body},\n    {{NULL, NULL, NULL}}}};\n")
    return "".join(out)


def main() -> None:
    root, output = sys.argv[1], sys.argv[2]
    sys.path.insert(0, root)
    from probing import __version__, attach
    from probing.analysis import asyncio_tasks
    from probing.cli import render
    from probing.cli.spec import BACKTRACE_OPTIONS, TARGET
    from probing.engine import backtrace, sources, target
    from probing.outside import pyspy
    from probing.protocol import frames, messages, tables

    lines = ["/* Generated by native/front/gen_tables.py from probing's Python modules: do not edit. */\n"]
    lines.append(f"#define PROBING_VERSION {c_string(__version__)}\n")
    lines.append(f"#define PROTOCOL_VERSION {messages.PROTOCOL_VERSION}\n")
    lines.append(f"#define MAX_HEADER_BYTES {frames.MAX_HEADER_BYTES}u\n")
    lines.append(f"#define EARLY_LOOK_US {round(backtrace.EARLY_LOOK_S * 1e6)}\n")
    lines.append(f"#define AGENT_SILENT {c_string(backtrace.AGENT_SILENT)}\n")
    lines.append(f"#define STILL_CHECK_US {round(target.STILL_CHECK_S * 1e6)}\n")
    lines.append(f"#define STILL_CHECKS {target.STILL_CHECKS}\n")
    lines.append(f"#define MAX_SOURCE_BYTES {sources.MAX_SOURCE_BYTES}u\n")
    lines.append(f"#define OUTSIDE_FLOOR_MS {round(pyspy.OUTSIDE_FLOOR_S * 1000)}\n")
    lines.append(f"#define HELPER_SCRIPT {c_string(pyspy.HELPER_SCRIPT)}\n")
    lines.append(f"#define AGENT_THREAD_SCRIPT {c_string(pyspy.AGENT_THREAD_SCRIPT)}\n")
    # attach.c: the helper's thread names, the hand-over to the Python CLI, the note's words.
    lines.append(f"#define WAITING_NAME {c_string(attach.WAITING_NAME)}\n")
    lines.append(f"#define LOADING_NAME {c_string(attach.LOADING_NAME)}\n")
    lines.append(f"#define INJECTED_ENV {c_string(attach.INJECTED_ENV)}\n")
    lines.append(f"#define ATTACH_HELD {c_string('; ' + attach.HELD)}\n")
    timeout = next(option.default for option in BACKTRACE_OPTIONS if option.name == "--timeout")
    lines.append(f"#define BACKTRACE_TIMEOUT_US {round(timeout * 1e6)}\n")
    # How a command line may name its target (main.c plain_backtrace): -t, --target.
    lines.append(strings("TARGET_OPTIONS", [TARGET.short, TARGET.name]))
    # The column types a table may have, each with its one encoding (table.c decode_column).
    lines.append("struct column_type { const char *type; const char *encoding; };\n")
    pairs = ",\n    ".join(
        f"{{{c_string(kind)}, {c_string(encoding)}}}" for kind, encoding in tables.ENCODING_OF_TYPE.items()
    )
    lines.append(
        f"static const struct column_type COLUMN_TYPES[] = {{\n    {pairs},\n    {{NULL, NULL}}}};\n"
    )
    # A thread running an asyncio loop (analysis/asyncio_tasks.py runs_loop): its answer goes
    # to the Python CLI, which shows the loop's tasks.
    lines.append(f"#define ASYNCIO_LOOP_FILE {c_string(asyncio_tasks.LOOP_FILE)}\n")
    lines.append(strings("ASYNCIO_LOOP_FUNCTIONS", asyncio_tasks.LOOP_FUNCTIONS))
    state_rules(lines)
    layout(lines)
    escapes = sorted(render.ESCAPED.items())
    lines.append("struct escape { unsigned code; const char *text; };\n")
    body = ",\n    ".join(f"{{0x{code:x}, {c_string(text)}}}" for code, text in escapes)
    lines.append(f"static const struct escape ESCAPES[] = {{\n    {body}}};\n")
    lines.append(f"#define ESCAPE_COUNT {len(escapes)}\n")
    spaces = [code for code in range(0x110000) if chr(code).isspace()]
    lines.append(f"static const unsigned SPACES[] = {{{', '.join(hex(code) for code in spaces)}}};\n")
    lines.append(f"#define SPACE_COUNT {len(spaces)}\n")
    # str.splitlines' line breaks (surrogates left out: they are never in decoded source text).
    breaks = [
        code
        for code in range(0x110000)
        if not 0xD800 <= code <= 0xDFFF and len(f"a{chr(code)}b".splitlines()) == 2
    ]
    lines.append(f"static const unsigned LINE_BREAKS[] = {{{', '.join(hex(code) for code in breaks)}}};\n")
    lines.append(f"#define LINE_BREAK_COUNT {len(breaks)}\n")
    with open(output, "w") as handle:
        handle.write("".join(lines))


if __name__ == "__main__":
    main()
