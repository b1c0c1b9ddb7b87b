#!/usr/bin/env bash
# Set-up and the everyday jobs, on a fresh machine or an existing checkout:
#   bash scripts/dev.sh demo   # profile the bundled default example on the CPU
#   bash scripts/dev.sh test   # run the whole test suite
#   bash scripts/dev.sh test --fast   # only the tests not marked slow (tests/conftest.py says which)
#   bash scripts/dev.sh lint   # ruff (lint, format), mypy --strict, StyLua, luacheck (CONTRIBUTING.md)
# Each creates .venv (Python >= 3.9) on first use and installs what it needs into it.
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
  # pyproject asks for torch>=2.1; when no torch is importable, pin 2.13.0 first, so that the range
  # does not pick whatever is newest. pip takes the build its index has for the platform: PyPI's
  # Linux wheel includes CUDA (several GB), an index with CPU builds installs in seconds; install
  # torch into $VENV yourself first to choose another (README.md, "Set-up and the two commands").
  if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
    echo "skyline: installing torch 2.13.0" >&2
    "$VENV/bin/python" -m pip install --quiet "torch==2.13.0"
  fi
  echo "skyline: installing skyline-nvim and its test dependencies" >&2
  "$VENV/bin/python" -m pip install --quiet -e ".[test]"
  touch "$stamp"
}

STYLUA_PACKAGE="@johnnymorganz/stylua@2.5.2"
LUA_TOOLS="$VENV/lua-tools"
LUACHECK=${LUACHECK:-luacheck}

# luacheck is no Python or npm package: Debian's lua-check (1.1.0), installed with apt-get when
# this runs as root (CI), else by hand.
setup_luacheck() {
  if command -v "$LUACHECK" >/dev/null 2>&1; then
    return
  fi
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "skyline: installing luacheck (apt-get install lua-check)" >&2
    local install=(apt-get install -y -qq --no-install-recommends lua-check)
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive "${install[@]}"; } >/dev/null; then
      echo "skyline: apt-get could not install lua-check" >&2
    fi
  fi
  if ! command -v "$LUACHECK" >/dev/null 2>&1; then
    echo "skyline: lint needs luacheck: 'sudo apt-get install lua-check' (Debian, Ubuntu)," \
      "'luarocks install luacheck' or 'brew install luacheck', or LUACHECK=/path/to/luacheck" \
      "(CONTRIBUTING.md)" >&2
    exit 1
  fi
}

setup_lint() {
  setup
  local stamp="$VENV/.skyline-lint-installed"
  if [ ! -f "$stamp" ] || [ "$stamp" -ot pyproject.toml ]; then
    echo "skyline: installing the lint tools" >&2
    "$VENV/bin/python" -m pip install --quiet -e ".[test,lint]"
    touch "$stamp"
  fi
  # StyLua as WebAssembly from the npm registry: no binary to download (scripts/stylua.mjs).
  if [ ! -f "$LUA_TOOLS/node_modules/@johnnymorganz/stylua/package.json" ]; then
    if ! command -v npm >/dev/null 2>&1; then
      echo "skyline: lint needs Node.js and npm for StyLua (CONTRIBUTING.md)" >&2
      exit 1
    fi
    echo "skyline: installing $STYLUA_PACKAGE" >&2
    npm install --silent --no-audit --no-fund --prefix "$LUA_TOOLS" "$STYLUA_PACKAGE" >&2
  fi
  setup_luacheck
}

# Runs every check, even after one fails, so that one run lists everything to fix.
lint() {
  local failed=()
  "$VENV/bin/ruff" check . || failed+=("ruff check")
  "$VENV/bin/ruff" format --check . || failed+=("ruff format --check")
  "$VENV/bin/mypy" || failed+=("mypy")
  node scripts/stylua.mjs --check --tools "$LUA_TOOLS" || failed+=("stylua --check")
  local luacheck=("$LUACHECK" --quiet)
  [ -t 1 ] || luacheck+=(--no-color) # no escape codes in CI's log
  "${luacheck[@]}" . || failed+=("luacheck")
  if [ ${#failed[@]} -gt 0 ]; then
    echo "skyline: lint failed: ${failed[*]}" >&2
    return 1
  fi
  echo "skyline: lint passed (ruff, ruff format, mypy, stylua, luacheck)" >&2
}

case "${1:-}" in
  demo)
    shift
    setup
    exec "$VENV/bin/skyline" profile examples/default/entry_point.py --device cpu "$@"
    ;;
  test)
    shift
    args=()
    for arg in "$@"; do
      if [ "$arg" = "--fast" ]; then
        args+=(-m "not slow")
      else
        args+=("$arg")
      fi
    done
    setup
    exec "$VENV/bin/python" -m pytest ${args[@]+"${args[@]}"}
    ;;
  lint)
    shift
    setup_lint
    lint
    ;;
  *)
    echo "usage: bash scripts/dev.sh demo|test [--fast]|lint [arguments]" >&2
    exit 2
    ;;
esac
