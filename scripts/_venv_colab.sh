# Sourced by scripts/test_platforms.sh: make .venv-colab, Colab's notebook stack (the kernel pins of
# tests/platforms/colab_gpu.txt: IPython 7.34, ipykernel 6.17.1, jupyter_client 7.4.9, ipywidgets
# 7.7.1, ...) with torch 2.13.0 (CPU), then install this project with its notebook extra and fail if
# that changed any package already there (checked on every run, against the venv as first made).
# Colab runs Python 3.13 and a CUDA torch; this venv uses this machine's python3 and CPU torch (the
# wheels here), emulating the rest. Made once (~45 s), then reused.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python3}"
VENV="${COLAB_VENV:-.venv-colab}"
if [ ! -f "$VENV/.made" ]; then
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    pins=$(grep -E '^(ipython|ipykernel|jupyter_client|jupyter_core|ipywidgets|widgetsnbextension|jupyterlab_widgets|notebook|traitlets|tornado|pyzmq)==' tests/platforms/colab_gpu.txt)
    # shellcheck disable=SC2086
    "$VENV/bin/python" -m pip install -q $pins "torch==2.13.0"
    "$VENV/bin/python" -m pip list --format=freeze | sort > "$VENV/platform.txt"
    touch "$VENV/.made"
fi
# Every run: install this checkout as a user would, then compare with the platform as it was made.
"$VENV/bin/python" -m pip install -q -e ".[notebook]"
"$VENV/bin/python" -m pip list --format=freeze | sort > "$VENV/now.txt"
changed=$(comm -23 "$VENV/platform.txt" "$VENV/now.txt")  # there before, not now: replaced
if [ -n "$changed" ]; then
    echo "scripts/_venv_colab.sh: installing .[notebook] replaced Colab's packages:" >&2
    echo "$changed" >&2
    exit 1
fi
