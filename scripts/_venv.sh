# Sourced by the other scripts: make .venv with the project and its dev tools, once.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
# torch first and pinned: an unpinned torch can pull a multi-GB CUDA build.
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
# DS_BUILD_OPS=0: DeepSpeed builds without CUDA, compiling its few CPU ops on first use.
DS_BUILD_OPS=0 .venv/bin/python -m pip install -q -e ".[dev,notebook,browser,bench,deepspeed,clients,ray,slurm,stateful]"
# The peer's sdist (its tests/ files, run by tests/peer_shim/run_peer_tests.py; never committed).
if [ ! -f .peer_sdist/accelerate-1.15.0.tar.gz ]; then
    .venv/bin/python -m pip download -q "accelerate==1.15.0" --no-binary :all: --no-deps -d .peer_sdist
fi
