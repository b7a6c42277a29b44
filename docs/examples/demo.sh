#!/usr/bin/env bash
# `make demo`: start docs/examples/train.py with the agent, ask it what the quick start asks,
# then stop it. Run from the repository root after `make install`.
set -euo pipefail
cd "$(dirname "$0")/../.."
probing=${PROBING_COMMAND:-.venv/bin/probing}
python=${PYTHON_COMMAND:-.venv/bin/python}
logs=$(mktemp -d)

# One job started with the agent in it, one started plainly (to attach to).
"$probing" run -- "$python" docs/examples/train.py >"$logs/out" 2>"$logs/err" &
runner=$!
"$python" docs/examples/train.py >"$logs/plain" 2>&1 &
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

echo "Demo training job: PID $pid (docs/examples/train.py)"
show backtrace
show eval "print(type(model), model)"
show eval "trainer.current_step, round(trainer.last_loss, 4)"
show eval --frame MainThread:train "loss.item()"
show query "SELECT func, file, lineno, depth FROM python.backtrace ORDER BY depth LIMIT 10"
show query --format json "SELECT name, daemon, cpu_user_s FROM python.threads"
show tables
echo
echo "A job started without probing (PID $plain): attach, look, detach."
show --plain inject
show --plain backtrace --thread MainThread
show --plain detach
echo
echo "Done: stopping the demo jobs."
