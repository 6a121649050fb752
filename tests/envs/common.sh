# Sourced by tests/envs/<framework>.sh: make one framework's own environment from PyPI alone.
#
#   make_env NAME 3.10        # .venv-NAME in the checkout root, on a local CPython >= 3.10
#   env_install PACKAGE...    # pip install into it (uv when on PATH: about a minute with a warm cache)
#   install_t2sql NAME        # this checkout with its NAME and test extras (builds the Rust core; the
#                             # cargo target/ is shared, so a second environment relinks only)
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

env_install() {
  if command -v uv >/dev/null; then
    uv pip install --quiet --python "$VENV/bin/python" "$@"
  else
    "$VENV/bin/python" -m pip install --quiet "$@"
  fi
}

install_t2sql() {
  # t2sql built from this checkout every time: uv keys a local project's cached build by its pyproject.toml,
  # so without the refresh an edited tree could install yesterday's wheel.
  if command -v uv >/dev/null; then
    uv pip install --quiet --python "$VENV/bin/python" --refresh-package t2sql --reinstall-package t2sql "$ROOT[$1,test]"
  else
    env_install --force-reinstall --no-deps "$ROOT" && env_install "$ROOT[$1,test]"
  fi
  "$VENV/bin/python" -c "import t2sql, t2sql.integrations.$1" >/dev/null
  echo "ready: $VENV ($(du -sh "$VENV" | cut -f1)); tests/test_frameworks.py runs tests/frameworks/test_$1.py in it"
}
