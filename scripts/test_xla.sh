#!/usr/bin/env bash
# Build .venv-xla (torch 2.9.0 + torch_xla 2.9.0: torch_xla needs its matching torch) and run
# the tests marked `xla` on one XLA CPU device (PJRT_DEVICE=CPU), e.g. scripts/test_xla.sh -x.
# From PyPI torch 2.9.0 is a CUDA build: ~3.9 GB download, ~7 GB venv; later runs reuse the venv.
# XLA_VENV=path picks another venv (an existing one with torch_xla is reused as it is).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python3}"
VENV="${XLA_VENV:-.venv-xla}"
if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
    echo '*' > "$VENV/.gitignore"  # keep the venv out of git
fi
if ! "$VENV/bin/python" -c "import torch_xla" 2>/dev/null; then
    "$VENV/bin/python" -m pip install -q --upgrade pip
    if ! "$VENV/bin/python" -m pip install -q "torch==2.9.0" "torch_xla==2.9.0"; then
        # A failed download (3.9 GB) is not a failed test: say so loudly, run nothing.
        echo "scripts/test_xla.sh: could not install torch 2.9.0 + torch_xla 2.9.0; XLA tests NOT run" >&2
        if [ -n "${XLA_REQUIRED:-}" ]; then exit 1; fi
        exit 0
    fi
fi
"$VENV/bin/python" -m pip install -q -e . --no-deps
"$VENV/bin/python" -m pip install -q cloudpickle pyyaml psutil numpy safetensors tqdm \
    pytest pytest-timeout ipykernel jupyter_client
export PJRT_DEVICE=CPU
# Only the XLA tests (tests/xla/): the others need the notebook extras this venv does not carry.
exec "$VENV/bin/python" -m pytest -q -m xla tests/xla "$@"
