#!/usr/bin/env bash
# Downloads into .whl/ the wheels experiments/gpu_check.sh needs on a GPU machine that has no
# network but has Python 3.12, torch, pandas, pyarrow, rich, typer, pytest, pytest-timeout,
# numpy, tqdm, PyYAML and MarkupSafe: pydantic and optuna with what they need beyond that.
# Versions are this environment's, so both machines run the same.
#
#   bash experiments/gpu_wheels.sh [--deepspeed]
#
# --deepspeed also builds a DeepSpeed wheel (pure Python; its CUDA ops are compiled on first
# use there) and fetches hjson, which it needs, so the benchmark compares against it too.
# Then copy .whl/ with the repository to the GPU machine and run bash experiments/gpu_check.sh
# there. The wheels stay under 64 MiB, to copy easily.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.whl
limit_mib=64
python=${PYTHON:-python3}

version() { "$python" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1"; }

# What autotune imports that the machine lacks, and their requirements in turn (checked with
# unzip -p .whl/NAME-*.whl '*/METADATA' | grep ^Requires-Dist): pydantic needs pydantic-core,
# annotated-types, typing-inspection and a newer typing-extensions; optuna needs alembic
# (which needs Mako), sqlalchemy and colorlog.
names=(pydantic pydantic-core annotated-types typing-inspection typing-extensions
    optuna alembic sqlalchemy colorlog mako)
specs=()
for name in "${names[@]}"; do
    specs+=("$name==$(version "$name")")
done

rm -rf "$dest"
mkdir -p "$dest"
platforms=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 \
    manylinux2014_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$tag")
done
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]}" -d "$dest" "${specs[@]}"

if [ "${1:-}" = "--deepspeed" ]; then
    # DeepSpeed publishes source only: build its wheel without compiling any op.
    DS_BUILD_OPS=0 "$python" -m pip wheel -q --no-deps -w "$dest" deepspeed
    "$python" -m pip download -q --no-deps --only-binary=:all: -d "$dest" hjson
fi

size_mib=$(du -sm "$dest" | cut -f1)
echo "wheels in $dest (${size_mib} MiB):"
ls "$dest"
if [ "$size_mib" -ge "$limit_mib" ]; then
    echo "too large: over $limit_mib MiB" >&2
    exit 1
fi
echo
echo "copy .whl/ with the repository to the GPU machine, then: bash experiments/gpu_check.sh"
