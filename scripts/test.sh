#!/usr/bin/env bash
# Set up .venv (if needed) and run the whole test suite, slow tests included.
source "$(dirname "$0")/_venv.sh"
exec .venv/bin/python -m pytest -q "$@"
