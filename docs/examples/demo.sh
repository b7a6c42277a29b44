#!/usr/bin/env bash
# `make demo`: start docs/examples/train.py with the agent, ask it what the quick start asks,
# then stop it. Run from the repository root after `make install`.
#
# It reads as a story, one step per screen: each step says what it asks, then shows the
# commands and what they print. On a terminal it waits for Enter between steps
# (PROBING_DEMO_PAUSE=0: it does not).
set -euo pipefail
cd "$(dirname "$0")/../.."
probing=${PROBING_COMMAND:-.venv/bin/probing}
python=${PYTHON_COMMAND:-.venv/bin/python}
logs=$(mktemp -d)

# One job started with the agent in it, one started plainly (to attach to). Each sleeps 0.2 s
# after a step, as a job waiting on its data would: its main thread is then found asleep, and a
# backtrace fits a screen, also on a loaded machine (mid-step, the DataLoader's collate alone is
# 13 frames deep).
"$probing" run -- "$python" docs/examples/train.py --pause 0.2 >"$logs/out" 2>"$logs/err" &
runner=$!
"$python" docs/examples/train.py --pause 0.2 >"$logs/plain" 2>&1 &
plain=$!
trap 'kill "$runner" "$plain" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$logs"' EXIT

# A job prints "ready" after its first training step; give it a minute to import torch.
wait_ready() {
    for _ in $(seq 600); do
        grep -q '^ready' "$1" && return 0
        kill -0 "$2" 2>/dev/null || { cat "$1" "$logs/err" >&2; exit 1; }
        sleep 0.1
    done
    echo "the demo job never became ready" >&2
    exit 1
}
wait_ready "$logs/out" "$runner"
wait_ready "$logs/plain" "$plain"
pid=$(sed -n 's/^probing: started PID \([0-9]*\).*/\1/p' "$logs/err")

bold_on=""; bold_off=""
if [ -t 1 ]; then bold_on=$(printf '\033[1m'); bold_off=$(printf '\033[0m'); fi
pause=no
if [ -t 0 ] && [ -t 1 ] && [ "${PROBING_DEMO_PAUSE:-1}" != 0 ]; then pause=yes; fi
steps=5
step_number=0

# A step: its title, and a sentence of what it shows. Each starts a screen of its own.
step() {
    step_number=$((step_number + 1))
    if [ "$pause" = yes ] && [ "$step_number" -gt 1 ]; then
        read -r -p "(Enter: next step) " _ || true
    fi
    printf '\n%sStep %d/%d. %s%s\n%s\n' "$bold_on" "$step_number" "$steps" "$1" "$bold_off" "$2"
}

show() {
    local pid=$pid
    if [ "$1" = "--plain" ]; then pid=$plain; shift; fi
    local shown="probing $pid" arg
    for arg in "$@"; do
        if [[ $arg =~ ^[A-Za-z0-9_./:=-]+$ ]]; then shown+=" $arg"; else shown+=" '$arg'"; fi
    done
    printf '\n%s$ %s%s\n' "$bold_on" "$shown" "$bold_off"
    "$probing" "$pid" "$@"
}

echo "A small PyTorch training job runs with the agent in it: PID $pid (docs/examples/train.py)."

step "Where is every thread, right now?" \
    "backtrace: each thread's stack, read like a traceback, the main thread first."
show backtrace

step "What is its state?" \
    "eval runs Python inside the job: its globals, or (--frame) a running function's locals."
show eval "print(type(model), model)"
show eval "trainer.current_step, round(trainer.last_loss, 4)"
show eval --frame MainThread:train "loss.item()"

step "What has it been doing?" \
    "query runs DuckDB SQL, in this process, over the tables the agent keeps."
show query "SELECT func, file, lineno, depth FROM python.backtrace ORDER BY depth LIMIT 10"
show query --format json "SELECT name, daemon, cpu_user_s FROM python.threads"

step "What can be asked?" \
    "The tables, one line each; \`probing $pid tables\` prints every column and what it means."
# The start of each table's description (no parentheses), cut to a line.
"$probing" "$pid" tables --format json | "$python" -c '
import json, re, sys
for table in json.load(sys.stdin):
    about = re.sub(r"\s*\([^)]+\)", "", table["doc"]).split(". ")[0].split(": ")[0].split("; ")[0].rstrip(".")
    name = table["name"]
    line = f"  {name:<23} {about}"
    print(line if len(line) <= 100 else line[:96].rsplit(" ", 1)[0] + " ...")
'

step "And a job started without probing?" \
    "inject attaches (the first command on such a job would too); detach takes the agent out again."
echo "A job started plainly: PID $plain."
show --plain inject
show --plain backtrace --thread MainThread
show --plain detach

echo
echo "Done: stopping the demo jobs. More in docs/quickstart.md and docs/guide.md."
