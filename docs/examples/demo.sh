#!/usr/bin/env bash
# `make demo`: start docs/examples/train.py with the agent, ask it what the quick start asks,
# then stop it. Run from the repository root after `make install`.
set -euo pipefail
cd "$(dirname "$0")/../.."
probing=${PROBING_COMMAND:-.venv/bin/probing}
python=${PYTHON_COMMAND:-.venv/bin/python}
logs=$(mktemp -d)

"$probing" run -- "$python" docs/examples/train.py >"$logs/out" 2>"$logs/err" &
runner=$!
trap 'kill "$runner" 2>/dev/null || true; wait "$runner" 2>/dev/null || true; rm -rf "$logs"' EXIT

# The job prints "ready" after its first training step; give it a minute to import torch.
for _ in $(seq 600); do
    grep -q '^ready' "$logs/out" && break
    kill -0 "$runner" 2>/dev/null || { cat "$logs/err" >&2; exit 1; }
    sleep 0.1
done
grep -q '^ready' "$logs/out" || { echo "the demo job never became ready" >&2; exit 1; }
pid=$(sed -n 's/^probing: started PID \([0-9]*\).*/\1/p' "$logs/err")

bold=""; plain=""
if [ -t 1 ]; then bold=$(printf '\033[1m'); plain=$(printf '\033[0m'); fi
show() {
    local shown="probing $pid" arg
    for arg in "$@"; do
        if [[ $arg =~ ^[A-Za-z0-9_./:=-]+$ ]]; then shown+=" $arg"; else shown+=" '$arg'"; fi
    done
    printf '\n%s$ %s%s\n' "$bold" "$shown" "$plain"
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
echo "Done: stopping the demo job."
