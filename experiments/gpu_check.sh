#!/usr/bin/env bash
# The CUDA path, checked in one command on a machine with a GPU.
#
#   bash experiments/gpu_check.sh [--dry-run] [OUTPUT_DIR]
#
# Steps: install the wheels carried in .whl/ (if any) into a temporary site dir; check that
# autotune imports and CUDA is there; run the GPU tests (pytest -m gpu tests/gpu); a short
# tuning run with the local runner; the engine benchmark on CUDA (autotune stage 0-3 against
# torch DDP / ZeroRedundancyOptimizer / FSDP / FSDP2, and DeepSpeed when it imports). Writes
# report.md and the raw logs to OUTPUT_DIR (default: $OUT where set, else
# results/gpu/check-<UTC time>) and exits non-zero if any step failed.
#
# --dry-run works without a GPU (CI runs it): the same steps, tools and files, the GPU tests
# collected and all skipped, the tuning run on CPU with a tiny model, the benchmark's flags
# parsed but nothing benchmarked.
#
# Step limits in seconds: GPU_CHECK_PYTEST_S (320), GPU_CHECK_TUNING_S (100),
# GPU_CHECK_BENCH_S (140): under 10 minutes with the rest, so that a command limited to that
# still writes its report.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
repo=$(pwd)

dry_run=0
out_dir=""
for arg in "$@"; do
    case "$arg" in
        --dry-run) dry_run=1 ;;
        -h | --help)
            sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        -*)
            echo "gpu_check.sh: unknown option $arg (see --help)" >&2
            exit 2
            ;;
        *) out_dir=$arg ;;
    esac
done
if [ -z "$out_dir" ]; then
    out_dir=${OUT:-results/gpu/check-$(date -u +%Y%m%dT%H%M%SZ)}
fi
mkdir -p "$out_dir" || exit 2
out_dir=$(cd "$out_dir" && pwd)

python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
steps="$work/steps.tsv" # one line per step: name, status, seconds, log file
: >"$steps"
export PYTHONUNBUFFERED=1
export AUTOTUNE_GPU_REPORT_DIR="$work/measurements" # the tests' measurements, for the report
mkdir -p "$AUTOTUNE_GPU_REPORT_DIR"

# step NAME LIMIT_S LOG COMMAND...: run it, time it, record ok/FAILED (exit code) in $steps.
step() {
    local name=$1 limit=$2 log=$3
    shift 3
    local started=$SECONDS code
    echo "== $name: $*"
    timeout --kill-after=10 "$limit" "$@" >"$out_dir/$log" 2>&1
    code=$?
    local status=ok
    if [ "$code" -eq 124 ] || [ "$code" -eq 137 ]; then
        status="FAILED (timed out after ${limit} s)"
    elif [ "$code" -ne 0 ]; then
        status="FAILED (exit $code)"
    fi
    printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$((SECONDS - started))" "$log" >>"$steps"
    echo "   $status in $((SECONDS - started)) s, log: $out_dir/$log"
    tail -n 3 "$out_dir/$log" | sed 's/^/   | /'
}

# Wheels carried for a machine without a network (see experiments/gpu_wheels.sh). They are
# built for the device machine's Python 3.12: a dry run checks they would install there.
site=""
if compgen -G ".whl/*.whl" >/dev/null; then
    install=("$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir
        --upgrade --target "$work/site")
    if [ "$dry_run" -eq 1 ]; then
        install+=(--dry-run --python-version 3.12 --implementation cp --only-binary=:all:)
        for tag in manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
            install+=(--platform "$tag")
        done
    else
        site="$work/site"
    fi
    step wheels 120 wheels.log "${install[@]}" .whl/*.whl
fi
export PYTHONPATH="${site:+$site:}$repo${PYTHONPATH:+:$PYTHONPATH}"

if [ "$dry_run" -eq 1 ]; then
    cuda_check="import torch; print('CUDA', torch.cuda.is_available())"
else
    cuda_check="import torch; assert torch.cuda.is_available(), 'no CUDA device visible'; \
print('CUDA', torch.version.cuda, torch.cuda.device_count(), torch.cuda.get_device_name(0))"
fi
step environment 120 environment.log "$python" -c "
import platform, autotune, optuna, pydantic, pytest, torch, typer
print('python', platform.python_version(), 'torch', torch.__version__, 'autotune',
      autotune.__version__, 'pydantic', pydantic.VERSION, 'optuna', optuna.__version__)
$cuda_check"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L >>"$out_dir/environment.log" 2>&1
fi

# Without CUDA (or autotune) nothing after this can pass: report at once.
if [ "$dry_run" -eq 0 ] && ! tail -n 1 "$steps" | grep -q $'\tok\t'; then
    "$python" experiments/gpu_report.py --steps "$steps" --output "$out_dir" \
        --measurements "$AUTOTUNE_GPU_REPORT_DIR"
    echo "report: $out_dir/report.md"
    exit 1
fi

# The GPU tests. On a GPU none may be skipped for want of CUDA; in a dry run all must be.
step gpu-tests "${GPU_CHECK_PYTEST_S:-320}" pytest.log \
    "$python" -m pytest -m gpu tests/gpu -p no:cacheprovider -rA -q
if [ "$dry_run" -eq 1 ]; then
    expect="skipped"
    grep -Eq "^[0-9]+ skipped" <(tail -n 1 "$out_dir/pytest.log") ||
        printf 'gpu-tests-skip\tFAILED (not every GPU test skipped without CUDA)\t0\tpytest.log\n' >>"$steps"
else
    expect="passed"
    if grep -q "SKIPPED.*needs CUDA" "$out_dir/pytest.log"; then
        printf 'gpu-tests-skip\tFAILED (GPU tests skipped on a GPU machine)\t0\tpytest.log\n' >>"$steps"
    fi
fi
echo "   (expected: $expect)"

# A short tuning run with the local runner, one rank per GPU: every stage, the two largest
# micro-batches that fit (up to 64), the best re-measured once. A dry run runs one experiment.
if [ "$dry_run" -eq 1 ]; then
    model=(-a n_layer=1 -a d_model=64 -a n_head=2 -a seq_len=32 -a vocab=256)
    search='"train_micro_batch_size_per_gpu": [4], "zero_optimization": {"stage": [1]}'
    tuning='"num_remeasure": 0, "tuner_num_trials": 1'
    end_step=5
else
    model=(-a n_layer=4 -a d_model=512 -a n_head=8 -a seq_len=256 -a vocab=8192)
    search='"zero_optimization": {"stage": "all", "overlap_comm": true}'
    tuning='"max_train_micro_batch_size_per_gpu": 64, "num_tuning_micro_batch_sizes": 2,
        "num_remeasure": 1, "tuner_num_trials": 8, "timeout_s": 60'
    end_step=15 # an H100 step of this model takes ~40 ms: a shorter window is all noise
fi
cat >"$work/tuning.json" <<JSON
{"optimizer": {"type": "AdamW", "params": {"lr": 3e-4}}, $search,
 "autotuning": {"fast": true, "start_profile_step": 3, "end_profile_step": $end_step, $tuning}}
JSON
step tuning "${GPU_CHECK_TUNING_S:-100}" tuning.log \
    "$python" -m autotune run --config "$work/tuning.json" --runner local --world-size 1 \
    --workload gpt "${model[@]}" --results-dir "$work/tuning" --quiet
if [ ! -f "$work/tuning/ds_config_optimal.json" ]; then
    printf 'tuning-optimal\tFAILED (no ds_config_optimal.json)\t0\ttuning.log\n' >>"$steps"
else
    cp "$work/tuning/summary.txt" "$AUTOTUNE_GPU_REPORT_DIR/tuning_summary.txt"
fi

# The engine against its peers on CUDA; DeepSpeed where this python imports it.
bench=("$python" experiments/bench_engine.py --device cuda --section time --rounds 1
    --steps 10 --warmup 3 --micro-batch 8 --output "$out_dir/bench_engine")
if "$python" -c "import deepspeed" >/dev/null 2>&1; then
    bench+=(--deepspeed-python "$(command -v "$python")")
fi
if [ "$dry_run" -eq 1 ]; then
    step benchmark 60 bench.log "${bench[@]}" --help
else
    step benchmark "${GPU_CHECK_BENCH_S:-140}" bench.log "${bench[@]}"
fi

report=("$python" experiments/gpu_report.py --steps "$steps" --output "$out_dir"
    --measurements "$AUTOTUNE_GPU_REPORT_DIR")
[ "$dry_run" -eq 1 ] && report+=(--dry-run)
"${report[@]}"
code=$?
echo "report: $out_dir/report.md"
exit "$code"
