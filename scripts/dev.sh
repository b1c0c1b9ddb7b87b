#!/usr/bin/env bash
# Set-up and the two everyday jobs, on a fresh machine or an existing checkout:
#   bash scripts/dev.sh demo   # profile the bundled default example on the CPU
#   bash scripts/dev.sh test   # run the whole test suite
# Both create .venv (Python >= 3.9) on first use and install what they need into it.
set -euo pipefail

cd "$(dirname "$0")/.."
VENV=${SKYLINE_VENV:-.venv}
PYTHON=${PYTHON:-python3}

setup() {
  if [ ! -x "$VENV/bin/python" ]; then
    echo "skyline: creating $VENV" >&2
    "$PYTHON" -m venv "$VENV"
  fi
  local stamp="$VENV/.skyline-installed"
  if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ]; then
    return
  fi
  # pyproject asks for torch>=2.1; install the CPU build 2.13.0 first when no torch is importable,
  # so that the range does not pull a multi-GB CUDA build onto a laptop or CI machine.
  if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
    echo "skyline: installing torch 2.13.0" >&2
    "$VENV/bin/python" -m pip install --quiet "torch==2.13.0"
  fi
  echo "skyline: installing skyline-nvim and its test dependencies" >&2
  "$VENV/bin/python" -m pip install --quiet -e ".[test]"
  touch "$stamp"
}

case "${1:-}" in
  demo)
    shift
    setup
    exec "$VENV/bin/skyline" profile examples/default/entry_point.py --device cpu "$@"
    ;;
  test)
    shift
    setup
    exec "$VENV/bin/python" -m pytest "$@"
    ;;
  *)
    echo "usage: bash scripts/dev.sh demo|test [arguments]" >&2
    exit 2
    ;;
esac
