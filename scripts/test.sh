#!/usr/bin/env bash
# Set up .venv (if needed) and run the whole test suite, slow tests included.
source "$(dirname "$0")/_venv.sh"
# The config panel's browser test needs Chromium (it skips, saying why, without it).
if ! command -v chromium >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
        || echo "could not install chromium: the browser test will be skipped"
fi
export TEST_ARTIFACTS_DIR="${TEST_ARTIFACTS_DIR:-$PWD/test-artifacts}"
exec .venv/bin/python -m pytest -q "$@"
