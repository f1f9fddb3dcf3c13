#!/usr/bin/env bash
# Set up .venv (if needed) and run the quickstart notebook headless, printing its outputs.
source "$(dirname "$0")/_venv.sh"
exec .venv/bin/python scripts/run_notebook.py demo_notebooks/01_quickstart.ipynb
