#!/usr/bin/env bash
# One call on the lent GPU machine (docs/benchmarks.md, "On a GPU"; ../shared/notes/gpu-device.md says what is there).
#
#   bash benchmarks/gpu_session.sh prepare   # here, with network: the wheels the machine lacks, into .whl/ (ignored)
#   bash benchmarks/gpu_session.sh run       # there, from the repo root, carrying .whl; everything lands in $OUT
#
# run: install the wheels into $SITE, a .pth so that every python (the workers, accelerate launch) sees the checkout
# and $SITE; scale.py for $TRAINERS, profiling $PROFILE (results, profile tables, worker logs copied into $OUT); then
# the test suite in what time is left. Every step runs under `timeout` against one clock: the whole never passes
# TOTAL_S. Environment, with defaults:
#   TOTAL_S=540      SCALE_S=420 (the benchmark's share at most; results are written after every trainer, so a cut
#                    keeps the trainers finished before it)
#   TRAINERS="grpo grpo_replay sft_packed dpo"       PROFILE="grpo sft_packed" ("all", "none")
#   SCALE_ARGS="--rounds 1"   PYTHON=python3   TRL_PYTHON=$PYTHON   SITE=/tmp/site
#   PTH=<$PYTHON's site-packages>/replayrl-dev.pth   TESTS=tests ("none": no test run)
#   PYTEST_ARGS="-q -n 16 -p no:cacheprovider --ignore=tests/vllm -rfE" (-n 16 dropped without pytest-xdist)
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
WHEELS=(datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 trl==1.16.0 xxhash==4.1.0 diffusers==0.42.1
    importlib_metadata==10.2.0 zipp==4.1.2 jmespath==1.0.1)

prepare() {
    mkdir -p .whl
    "$PYTHON" -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --platform manylinux_2_28_x86_64 -d .whl "${WHEELS[@]}"
    git check-ignore -q .whl || { echo ".whl/ is not git-ignored: add /.whl/ to .gitignore" >&2; exit 1; }
    du -sh .whl
}

START=$(date +%s)
RESERVE=10 # seconds kept for copying and the summary at the end

# within SECONDS CMD...: run CMD for at most SECONDS, and never past TOTAL_S - RESERVE (timeout's -k 3 included).
within() {
    local want=$1 left
    shift
    left=$((TOTAL_S - RESERVE - 3 - ($(date +%s) - START)))
    ((want > left)) && want=$left
    if ((want < 5)); then
        echo "skipped (no time left): $*"
        return 124
    fi
    timeout -k 3 "$want" "$@"
}

run() {
    : "${OUT:?OUT must name the folder for the results}"
    OUT=$(mkdir -p "$OUT" && cd "$OUT" && pwd)
    TOTAL_S=${TOTAL_S:-540}
    local site=${SITE:-/tmp/site} trainers=${TRAINERS:-grpo grpo_replay sft_packed dpo} rc
    local pytest_args=${PYTEST_ARGS:--q -n 16 -p no:cacheprovider --ignore=tests/vllm -rfE}
    local marker profile=(--profile ${PROFILE:-grpo sft_packed})
    [[ ${PROFILE:-} == all ]] && profile=(--profile)
    [[ ${PROFILE:-} == none ]] && profile=()
    marker=$(mktemp)
    mkdir -p "$OUT/logs" "$OUT/results"
    export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
    {
        within 20 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
        within 120 "$PYTHON" -m pip install -q --no-index --no-deps --target "$site" .whl/*.whl
        local pth=${PTH:-$("$PYTHON" -c 'import site; print(site.getsitepackages()[0])')/replayrl-dev.pth}
        printf '%s\n%s\n' "$PWD" "$site" >"$pth" && echo "wrote $pth"
        within 60 "$PYTHON" -c "import torch, transformers, trl, datasets, replayrl; print('torch', torch.__version__,
            'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__, 'trl', trl.__version__)"
    } >"$OUT/setup.txt" 2>&1
    # shellcheck disable=SC2086 # word splitting of the lists is meant
    within "${SCALE_S:-420}" "$PYTHON" benchmarks/scale.py ${SCALE_ARGS:---rounds 1} --logs "$OUT/logs" \
        --trl-python "${TRL_PYTHON:-$PYTHON}" --trainers $trainers ${profile[@]+"${profile[@]}"} >"$OUT/scale.txt" 2>&1
    rc=$?
    echo "scale rc=$rc after $(($(date +%s) - START)) s" >>"$OUT/scale.txt"
    # Written during this run only: the results JSON and the profile tables (scale.py writes them per trainer).
    (cd benchmarks/results && find . -path './scale_*' -type f -newer "$marker" -exec cp --parents {} "$OUT/results" \;)
    rm -f "$marker"
    [[ ${TESTS:-tests} == none ]] || run_tests "$pytest_args" "${TESTS:-tests}"
    summary
}

run_tests() {
    local pytest_args=$1 tests=$2
    "$PYTHON" -c "import xdist" 2>/dev/null || pytest_args=${pytest_args/-n 16/}
    echo "pytest $pytest_args $tests, within $((TOTAL_S - RESERVE - 3 - ($(date +%s) - START))) s" >"$OUT/tests.txt"
    # shellcheck disable=SC2086
    within 100000 "$PYTHON" -m pytest $pytest_args $tests >>"$OUT/tests.txt" 2>&1
    echo "tests rc=$? after $(($(date +%s) - START)) s" >>"$OUT/tests.txt"
}

# What the device tool's output tail shows: setup, the scale lines and table, the end of the test run.
summary() {
    tail -n 4 "$OUT/setup.txt"
    grep -E '^(  [a-z_]+ round|    profile|      top|replayrl vs|trainer|-+  -+|[a-z_]+ +(trl|replayrl)|scale rc)' \
        "$OUT/scale.txt" | tail -n 60
    [[ ! -f $OUT/tests.txt ]] || tail -n 25 "$OUT/tests.txt"
}

case "${1:-}" in
prepare) prepare ;;
run) run ;;
*)
    echo "usage: bash benchmarks/gpu_session.sh prepare|run" >&2
    exit 2
    ;;
esac
