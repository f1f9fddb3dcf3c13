#!/usr/bin/env bash
# Build .gpu_wheels/: the Python 3.12 wheels that scripts/gpu_check.sh installs on a GPU machine with
# no network (its python3 already has torch, accelerate, transformers, pytest...). Run it here, on a
# machine that reaches PyPI and has this project's .venv (DeepSpeed publishes no wheel: one is built
# from its source with DS_BUILD_OPS=0, so its ops compile on the GPU machine on first use).
# Then carry .gpu_wheels to the GPU machine together with the checkout (~25 MB).
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=.gpu_wheels
DEEPSPEED=deepspeed==0.19.8
mkdir -p "$DEST"
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$DEST" \
    ipykernel jupyter_client nbclient nbformat ipywidgets setproctitle hjson pydantic
if ! ls "$DEST"/deepspeed-*.whl >/dev/null 2>&1; then
    DS_BUILD_OPS=0 .venv/bin/python -m pip wheel -q --no-deps --no-build-isolation -w "$DEST" "$DEEPSPEED"
fi
ls "$DEST"
du -sh "$DEST"
