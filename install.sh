#!/usr/bin/env bash
# Installs autotune into the active Python environment.
#   bash install.sh         the tool
#   bash install.sh dev     the tool plus test and lint tools, and DeepSpeed (as `deepspeed`)
#   bash install.sh deepspeed   the tool plus DeepSpeed, to tune on it (autotuning.engine)
#   bash install.sh browser     Debian's headless Chromium, which the page's tests drive with
#                               Playwright (its own browser download does not work everywhere);
#                               `dev` installs it too where it can (as root, with apt-get)
# torch goes in first and explicitly: with a GPU (nvidia-smi answers) the default CUDA build,
# without one the CPU build, so a laptop or CI box never pulls a multi-GB CUDA wheel.
# AUTOTUNE_TORCH_SPEC overrides the torch requirement (e.g. "torch==2.9.1").
set -euo pipefail
cd "$(dirname "$0")"
extra=""
# Debian's chromium-headless-shell (apt) for the service page's Playwright tests.
install_browser() {
    if command -v chromium-headless-shell >/dev/null 2>&1 || [ -x /usr/lib/chromium/chromium-headless-shell ]; then
        return 0
    fi
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium-headless-shell >/dev/null
    else
        echo "note: the page's browser tests need Debian's chromium-headless-shell" \
            "(apt-get install chromium-headless-shell); they skip without it" >&2
    fi
}
if [ "${1:-}" = "browser" ]; then
    install_browser
    exit 0
fi
[ "${1:-}" = "dev" ] && extra="[dev]"
[ "${1:-}" = "deepspeed" ] && extra="[deepspeed]"
pip() { python -m pip --disable-pip-version-check -q "$@"; }

if [ -n "${AUTOTUNE_TORCH_SPEC:-}" ]; then
    pip install "$AUTOTUNE_TORCH_SPEC"
elif python -c "import torch" 2>/dev/null; then
    :  # keep the torch the user already has
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    pip install "torch>=2.4,<2.15"
else
    # CPU-only: 2.13.0 is the CPU wheel on this project's machines; elsewhere PIP_EXTRA_INDEX_URL
    # may point at https://download.pytorch.org/whl/cpu to get the CPU build.
    pip install "torch==2.13.0"
fi
# The rest with uv where it is on the PATH (about 20 s against pip's 2-3 minutes for `dev`),
# else pip. uv reads no pip configuration, so torch stays the build pip chose above: a
# constraint holds it to the installed version. Compiled to bytecode as pip does: where
# nothing may write it later (PYTHONDONTWRITEBYTECODE), every process would compile every
# module it imports (the tests ran 40% longer).
hold=""
if command -v uv >/dev/null 2>&1; then
    hold=$(mktemp)
    trap 'rm -f "$hold"' EXIT
    python -c "import torch; print('torch==' + torch.__version__)" >"$hold"
fi
install_rest() {
    if [ -n "$hold" ]; then
        # pip again if uv cannot (an index that only pip's configuration names, say)
        uv pip install --quiet --compile-bytecode --python "$(command -v python)" --constraint "$hold" "$@" ||
            pip install "$@"
    else
        pip install "$@"
    fi
}
if [ -n "$extra" ]; then
    # DeepSpeed ships as a source distribution whose build imports torch: built against the
    # torch installed above (an isolated build would fetch another, CUDA, torch). Its ops are
    # compiled on first use, not here.
    DS_BUILD_OPS=0 install_rest --no-build-isolation "deepspeed>=0.14,<0.20"
fi
install_rest -e ".${extra}"
# The project's own modules too: an editable install leaves them as source, which such a
# machine compiles again in every process (0.15-0.2 s of each that imports all of autotune).
python -m compileall -q autotune >/dev/null
if [ "${1:-}" = "dev" ]; then
    install_browser
fi
