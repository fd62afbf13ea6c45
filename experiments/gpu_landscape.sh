#!/usr/bin/env bash
# The GPU landscape, in one command on a machine with one GPU: a GPT of ~400M parameters
# (GPT-2 medium's shape, untied head; LANDSCAPE_MODEL=large: GPT-2 large's, ~840M) in bf16,
# every ZeRO stage x the micro-batches up to the largest that fits the budget, without and
# with activation checkpointing, repeated.
#
#   bash experiments/gpu_landscape.sh [OUTPUT_DIR]
#
# Writes gpt350m_bf16[_ckpt]_<budget>.json (experiments/landscape.py's tables) and their logs
# to OUTPUT_DIR (default: $OUT where set, else results/landscapes). The budget
# (LANDSCAPE_BUDGET, default 40GiB: an A100-40GB's share) puts the out-of-memory boundary where
# checkpointing matters; each table gets LANDSCAPE_TIME_S seconds (default 150) of
# experiments after its probes, and keeps what was measured by then. Then, with the time
# left under LANDSCAPE_EXTRA_S (default 0), the HF Trainer tests at ZeRO stage 3.
# LANDSCAPE_CHECKPOINTING (default "false true") picks the tables: without and/or with
# activation checkpointing.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
out_dir=${1:-${OUT:-results/landscapes}}
mkdir -p "$out_dir"
budget=${LANDSCAPE_BUDGET:-40GiB}
time_s=${LANDSCAPE_TIME_S:-150}
export PYTHONUNBUFFERED=1

if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 2
    export PYTHONPATH=/tmp/site:$(pwd)${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi -L 2>/dev/null

case ${LANDSCAPE_MODEL:-medium} in
    medium) shape=(n_layer=24 d_model=1024 n_head=16) prefix=gpt350m ;;
    large) shape=(n_layer=36 d_model=1280 n_head=20) prefix=gpt774m ;;
    *) echo "LANDSCAPE_MODEL: medium or large, not ${LANDSCAPE_MODEL}" >&2; exit 2 ;;
esac
model=()
for arg in "${shape[@]}" seq_len=1024 vocab=50304; do model+=(-a "$arg"); done
code=0
for ckpt in ${LANDSCAPE_CHECKPOINTING:-false true}; do
    name=${prefix}_bf16$([ "$ckpt" = true ] && echo _ckpt)_${budget,,}
    # LANDSCAPE_SIZES / LANDSCAPE_SIZES_CKPT: measure these micro-batches instead of probing
    sizes=$([ "$ckpt" = true ] && echo "${LANDSCAPE_SIZES_CKPT:-}" || echo "${LANDSCAPE_SIZES:-}")
    python3 experiments/landscape.py --workload gpt "${model[@]}" \
        -a activation_checkpointing=$ckpt --bf16 --runner inprocess --world-size 1 --cpus-per-rank 8 \
        --device-memory "$budget" ${sizes:+--micro-batches "$sizes"} --no-knobs --max-micro-batch 128 --repeats 3 \
        --start-profile-step 3 --end-profile-step 8 --time-limit-s "$time_s" \
        --note "one GPU, in-process runner, activation checkpointing $ckpt" \
        --out "$out_dir/$name.json" 2>&1 | tee "$out_dir/$name.log" | grep -v Warning
    [ "${PIPESTATUS[0]}" -eq 0 ] || code=1
done

if [ "${LANDSCAPE_EXTRA_S:-0}" -gt 0 ]; then
    timeout "${LANDSCAPE_EXTRA_S}" python3 -m pytest -m gpu tests/gpu/test_hf_cuda.py \
        -k "3-fp32 or 3-bf16" -p no:cacheprovider -rA -q 2>&1 | tee "$out_dir/pytest-hf-stage3.log" | tail -n 5
fi
exit "$code"
