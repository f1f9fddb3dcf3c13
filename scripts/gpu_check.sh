#!/usr/bin/env bash
# The CUDA path, checked on a real GPU in one go (scripts/gpu_check/run.py: items 1-7 of the GPU
# check, each PASS / FAIL / N/A with its figures; a log and summary.json in $OUT, or a temporary
# folder). On a machine without CUDA it is a dry run: every GPU item says N/A and it exits 0.
# Packages the machine's python3 lacks travel as wheels in .gpu_wheels/ (scripts/gpu_wheels.sh
# builds it) and are installed without the network into a folder put on PYTHONPATH.
# Arguments go to run.py (e.g. --only check_sharding).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ -d .gpu_wheels ]; then
    SITE="${GPU_CHECK_SITE:-/tmp/gpu_check_site}"
    "$PY" scripts/gpu_check/install_wheels.py .gpu_wheels "$SITE"
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
exec "$PY" scripts/gpu_check/run.py "$@"
