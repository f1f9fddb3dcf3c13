#!/usr/bin/env bash
# Set up .venv (if needed), check the code (ruff) and the layering (lint-imports: the contracts in
# pyproject.toml), failing fast, then run the whole test suite, slow and browser tests included, then
# the platforms' stacks (scripts/test_platforms.sh: pip's resolver on Colab's, Kaggle's and
# SageMaker's pins, a kernel on Colab's IPython 7.34 / ipywidgets 7.7.1; ~1.5 min the first time),
# then the XLA tests in their own environment (scripts/test_xla.sh: torch_xla needs its own torch;
# ~4.5 min and a 3.9 GB download the first time). NOTEBOOK_ACCEL_SKIP_XLA=1 skips that part.
# Arguments go to the main pytest run, which prints the 25 slowest tests.
# --fast (first argument): the inner loop: ruff, lint-imports and tests/unit only (one process,
# no subprocess, kernel or training: under a minute), then stop; other arguments go to that pytest.
source "$(dirname "$0")/_venv.sh"
.venv/bin/ruff check .
.venv/bin/lint-imports
if [ "${1:-}" = "--fast" ]; then
    shift
    exec .venv/bin/python -m pytest -q tests/unit "$@"
fi
# The config panel's browser test needs Chromium (it skips, saying why, without it); the cluster
# tests run their raylets in a private network namespace, whose loopback iproute2's ip brings up
# (without it they bind loopback addresses in the machine's namespace).
missing=()
command -v chromium >/dev/null || missing+=(chromium)
command -v ip >/dev/null || missing+=(iproute2)
if [ ${#missing[@]} -gt 0 ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; } \
        || echo "could not install ${missing[*]}: the browser test skips, the cluster tests use loopback addresses"
fi
export TEST_ARTIFACTS_DIR="${TEST_ARTIFACTS_DIR:-$PWD/test-artifacts}"
.venv/bin/python -m pytest -q --durations=25 "$@"
bash scripts/test_platforms.sh
if [ -z "${NOTEBOOK_ACCEL_SKIP_XLA:-}" ]; then
    bash scripts/test_xla.sh
fi
