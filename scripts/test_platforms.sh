#!/usr/bin/env bash
# The platforms' own stacks (tests/platforms/, marker `platforms`): pip's resolver on the pins of
# Colab GPU/TPU, Kaggle GPU/TPU and SageMaker Distribution 4.4 (metadata only: nothing big is
# downloaded), then a real kernel on Colab's notebook stack in .venv-colab (scripts/_venv_colab.sh;
# ~45 s to make the first time, reused after). Runs in .venv (scripts/_venv.sh makes it); arguments
# go to pytest, e.g. scripts/test_platforms.sh -x.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_venv_colab.sh"
exec .venv/bin/python -m pytest -q -m platforms tests/platforms "$@"
