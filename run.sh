#!/usr/bin/env bash
# One entry point for a fresh Linux or macOS machine:
#   bash run.sh example   set up .venv, then train the tic-tac-toe league offline on the built-in tiny model
#   bash run.sh test      set up .venv, then run the test suite
#   bash run.sh setup     only set up
set -euo pipefail
cd "$(dirname "$0")"
VENV="${AUTOCURRICULA_VENV:-.venv}"
PY="$VENV/bin/python"

setup() {
  local python="${PYTHON:-python3}"
  if [ ! -x "$PY" ]; then
    "$python" -c 'import sys; assert sys.version_info >= (3, 10), "Python >= 3.10 needed"'
    "$python" -m venv "$VENV"
  fi
  UV="$VENV/bin/uv"
  if [ ! -x "$UV" ]; then
    if "$PY" -m pip --version >/dev/null 2>&1; then
      "$PY" -m pip install -q --disable-pip-version-check uv
    elif command -v uv >/dev/null 2>&1; then
      UV="$(command -v uv)"
    else
      "$python" -m pip install -q --user uv && UV="$("$python" -c 'import sysconfig; print(sysconfig.get_path("scripts", "posix_user"))')/uv"
    fi
  fi
  # uv does not read pip.conf: pass on its find-links and extra index URLs (e.g. a local torch
  # CPU wheel directory or a mirror).
  local extra=() v
  for v in $(pip_conf find-links) ${PIP_FIND_LINKS:-}; do extra+=(--find-links "$v"); done
  for v in $(pip_conf extra-index-url) ${PIP_EXTRA_INDEX_URL:-}; do extra+=(--extra-index-url "$v"); done
  for v in $(pip_conf index-url) ${PIP_INDEX_URL:-}; do extra+=(--index-url "$v"); done
  # constraints.txt pins torch to 2.13.0 so peft/trl never pull CUDA wheels on a CPU machine.
  # ${extra[@]+...}: bash 3.2 (macOS) treats an empty array as unset under `set -u`.
  # unsafe-best-match: with several indexes (a mirror plus extra ones), take the best version from
  # any of them, as pip does, instead of only the first index that lists a package.
  "$UV" pip install -q --python "$PY" --compile-bytecode --index-strategy unsafe-best-match \
      ${extra[@]+"${extra[@]}"} -c constraints.txt -e ".[dev,hf,hub,games,openspiel]"
  if [ "$(uname -s)" = "Linux" ]; then fast_blas; fi
  "$PY" -m autocurricula.cli env | grep -E '^(blas|gemm_gflops|device)'
}

pip_conf() {
  { "$PY" -m pip config get "global.$1" 2>/dev/null || "${PYTHON:-python3}" -m pip config get "global.$1" 2>/dev/null; } || true
}

# MLX's Linux CPU wheel ships a slow reference BLAS; autocurricula preloads OpenBLAS when present.
fast_blas() {
  if "$PY" -c 'import autocurricula.engine.blas as b, sys; sys.exit(0 if b.preload()["library"] else 1)'; then return; fi
  if command -v apt-get >/dev/null 2>&1; then
    local sudo=""
    if [ "$(id -u)" != 0 ]; then sudo="sudo -n"; fi
    if $sudo true 2>/dev/null; then
      ($sudo apt-get install -y -qq libopenblas0-pthread >/dev/null 2>&1 \
        || { $sudo apt-get update -qq >/dev/null 2>&1 && $sudo apt-get install -y -qq libopenblas0-pthread >/dev/null 2>&1; }) || true
    fi
  fi
  if ! "$PY" -c 'import autocurricula.engine.blas as b, sys; sys.exit(0 if b.preload()["library"] else 1)'; then
    # PyPI route (needs the system's libgfortran.so.5)
    "$UV" pip install -q --python "$PY" cmeel-openblas || true
  fi
}

case "${1:-}" in
  setup) setup ;;
  example) setup; shift; "$PY" examples/tictactoe_league.py "$@" ;;
  test) setup; shift; "$PY" -m pytest -q "$@" ;;
  *) echo "usage: bash run.sh example|test|setup" >&2; exit 2 ;;
esac
