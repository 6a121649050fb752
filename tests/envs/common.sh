# Sourced by tests/envs/<framework>.sh: make one framework's own environment from PyPI alone.
#
#   make_env NAME 3.10           # .venv-NAME in the checkout root, on a local CPython >= 3.10
#   pin PACKAGE==VERSION...      # the versions the test was last run with: every install below keeps to them
#   documented pip install ARGS  # a command docs/NAME.md gives, run as a user runs it from the checkout's root
#                                # (into the environment, uv when on PATH); tests/test_frameworks.py checks the
#                                # scripts run exactly the documented commands
#   check_entrypoint NAME        # `python -m t2sql.integrations.NAME --help` exits 0 without a traceback
#   install_test_extra NAME      # this checkout's NAME and test extras (pytest and the tests' own needs)
#
# Each framework pins its own transformers range, so each gets its own environment; tests/test_frameworks.py
# runs tests/frameworks/test_NAME.py inside it when it exists. VENV overrides where it goes.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

find_python() {  # the first local CPython >= $1 (python3, python3.N on PATH, then pyenv's): never a download
  local want="$1" candidate version
  for candidate in python3 python3.10 python3.11 python3.12 python3.13 python3.14; do
    command -v "$candidate" >/dev/null 2>&1 || continue
    if "$candidate" -c "import sys; sys.exit(sys.version_info < tuple(map(int, '$want'.split('.'))))" 2>/dev/null
    then command -v "$candidate"; return 0; fi
  done
  # pyenv's shims refuse an interpreter pyenv has not selected: an installed 3.12 may answer on no name on
  # PATH. Ask pyenv for its lowest version that will do.
  if command -v pyenv >/dev/null 2>&1; then
    for version in $(pyenv versions --bare 2>/dev/null | grep -E '^3\.[0-9]+\.[0-9]+$' | sort -V); do
      candidate="$(PYENV_VERSION="$version" pyenv which python3 2>/dev/null)" || continue
      if "$candidate" -c "import sys; sys.exit(sys.version_info < tuple(map(int, '$want'.split('.'))))" 2>/dev/null
      then echo "$candidate"; return 0; fi
    done
  fi
  echo "no local Python >= $want (python3 or python3.N on PATH, or pyenv's); install one, or set PYTHON" >&2
  return 1
}

make_env() {
  local name="$1" want="$2"
  VENV="${VENV:-$ROOT/.venv-$name}"
  local python="${PYTHON:-$(find_python "$want")}"
  echo "building $VENV with $("$python" --version 2>&1) ($(command -v uv >/dev/null && echo uv || echo pip))"
  rm -rf "$VENV"
  if command -v uv >/dev/null; then
    uv venv --quiet --python "$python" "$VENV"
  else
    "$python" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
  fi
}

env_install() {  # pip install into the environment, keeping to the pins
  if command -v uv >/dev/null; then
    uv pip install --quiet --python "$VENV/bin/python" --constraint "$VENV/pins.txt" "$@"
  else
    "$VENV/bin/python" -m pip install --quiet --constraint "$VENV/pins.txt" "$@"
  fi
}

pin() {
  printf '%s\n' "$@" > "$VENV/pins.txt"
}

documented() {
  if [ "${1:-} ${2:-}" != "pip install" ]; then
    echo "documented: give the command as docs/ writes it (pip install ...), not: $*" >&2
    return 2
  fi
  shift 2
  # uv keys a local project's cached build by its pyproject.toml: without the refresh an edited tree could
  # install yesterday's wheel. pip builds a local directory every time.
  local refresh=()
  if command -v uv >/dev/null; then refresh=(--refresh-package t2sql --reinstall-package t2sql); fi
  (cd "$ROOT" && env_install "${refresh[@]}" "$@")
}

check_entrypoint() {
  local out
  if ! out="$("$VENV/bin/python" -m "t2sql.integrations.$1" --help 2>&1)" || [[ "$out" == *Traceback* ]]; then
    echo "python -m t2sql.integrations.$1 --help fails with only the documented install:" >&2
    echo "$out" >&2
    return 1
  fi
}

install_test_extra() {
  (cd "$ROOT" && env_install ".[$1,test]")
  "$VENV/bin/python" -c "import t2sql, t2sql.integrations.$1" >/dev/null
  echo "ready: $VENV ($(du -sh "$VENV" | cut -f1)); tests/test_frameworks.py runs tests/frameworks/test_$1.py in it"
}
