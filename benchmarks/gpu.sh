#!/usr/bin/env bash
# The CUDA paths, on a machine with a GPU and a CUDA build of torch already installed (CI has no
# GPU: there these tests skip). A venv over that torch gets probing from this checkout, then:
#   1. the CUDA and NCCL tests (trace with CUDA events and memory columns, NaN checks on the
#      device, torch.cuda_memory and process.memory's CUDA columns, NCCL's Flight Recorder);
#   2. bench_torch.py on the GPU: step-time overhead of trace and nan, and the cost per call;
#   3. the torch test files whole, against that machine's torch version.
#
#     bash benchmarks/gpu.sh                 # PYTHON=python3, duckdb and py-spy from the registry
#     WHEELS=.whl bash benchmarks/gpu.sh     # a machine with no registry: wheels carried in .whl/
#     BASELINE=.gpu/old bash benchmarks/gpu.sh   # step 2 also with an earlier tracer, in turn:
#         mkdir -p .gpu/old && git archive REV probing benchmarks/bench_torch.py | tar -x -C .gpu/old
#         (an ignored folder; that revision's benchmark runs its tracer where it is there)
# Logs go to $OUT (or /tmp/probing-gpu-logs).
set -uo pipefail
PYTHON=${PYTHON:-python3}
VENV=${VENV:-/tmp/probing-gpu}
LOGS=${OUT:-/tmp/probing-gpu-logs}
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1

"$PYTHON" -m venv --system-site-packages "$VENV" || exit 1
# --system-site-packages reaches the base interpreter's packages only: where PYTHON is itself a
# venv's (torch installed there), its site-packages go on the new venv's path too.
"$PYTHON" -c 'import site; print("\n".join(site.getsitepackages()))' \
    >"$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/outer.pth"
if [ -n "${WHEELS:-}" ]; then
    others=$(ls "$WHEELS"/*.whl | grep -v '/probing-')
    # shellcheck disable=SC2086
    [ -z "$others" ] || "$VENV/bin/pip" install -q --no-index --no-deps $others || exit 1
else
    "$VENV/bin/pip" install -q duckdb py-spy || exit 1
fi
# probing from this checkout; on a machine with no C compiler, a probing wheel built elsewhere
# from the same tree may come in WHEELS instead (.whl here: `pip wheel --no-deps -w .whl .`).
if command -v "${CC:-cc}" >/dev/null || command -v gcc >/dev/null; then
    rm -rf build probing.egg-info
    "$VENV/bin/pip" install -q --no-deps --no-build-isolation . || exit 1
    rm -rf build probing.egg-info
elif ls "${WHEELS:-/nonexistent}"/probing-*.whl >/dev/null 2>&1; then
    "$VENV/bin/pip" install -q --no-index --no-deps "$WHEELS"/probing-*.whl || exit 1
else
    echo "gpu.sh: no C compiler here and no probing wheel in WHEELS" >&2
    exit 1
fi
# torchrun, run by the venv's interpreter (the tests start it from the venv's bin/).
[ -x "$VENV/bin/torchrun" ] || printf '#!%s\nfrom torch.distributed.run import main\nmain()\n' \
    "$VENV/bin/python" >"$VENV/bin/torchrun" && chmod +x "$VENV/bin/torchrun"
nvidia-smi -L
"$VENV/bin/python" -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__,
    "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'

TESTS="tests/integration/test_torch.py tests/integration/test_memory.py tests/integration/test_collectives.py
    tests/integration/hostile/test_tensor_leaks_named.py"
echo "== 1. CUDA tests"
# shellcheck disable=SC2086
"$VENV/bin/python" -m pytest -p no:cacheprovider -q -rs -k "cuda or nccl or gpu" $TESTS 2>&1 | tee "$LOGS/cuda_tests.log"
echo "== 2. bench_torch.py --device cuda"
"$VENV/bin/python" benchmarks/bench_torch.py --device cuda ${BENCH_ARGS:-} 2>&1 | tee "$LOGS/bench_torch_cuda.log"
if [ -n "${BASELINE:-}" ]; then
    # The same machine, the tracer of BASELINE/probing (imported first), then this tree's again.
    for which in baseline this; do
        echo "== 2. bench_torch.py --device cuda, $which tracer"
        bench=benchmarks/bench_torch.py path=""
        if [ $which = baseline ]; then
            path=$(cd "$BASELINE" && pwd)
            # The benchmark of the same revision, where BASELINE holds it (its tracer's switches).
            [ -f "$path/benchmarks/bench_torch.py" ] && bench=$path/benchmarks/bench_torch.py
        fi
        PYTHONPATH=$path "$VENV/bin/python" "$bench" --device cuda --skip-query \
            2>&1 | tee "$LOGS/bench_torch_cuda_$which.log"
    done
fi
echo "== 3. the torch test files whole"
# shellcheck disable=SC2086
timeout "${WHOLE_TIMEOUT:-300}" "$VENV/bin/python" -m pytest -p no:cacheprovider -v -rs $TESTS 2>&1 \
    | tee "$LOGS/torch_tests.log" | grep -E "FAILED|ERROR|passed|failed"
