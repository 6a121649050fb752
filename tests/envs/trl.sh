#!/usr/bin/env bash
# The environment tests/frameworks/test_trl.py runs in: TRL's released GRPOTrainer on CPU, from PyPI alone.
#
#   tests/envs/trl.sh     # makes .venv-trl (about 6 GB: torch's wheel carries CUDA; it runs on CPU)
#   .venv-trl/bin/python -m pytest tests/frameworks/test_trl.py    # tests/test_frameworks.py runs it too
#
# TRL 1.16 needs Python >= 3.11 and, for environment_factory with Qwen3.6's XML tool calls, transformers
# >= 5.15 (the response_template parser with tool-typed arguments). The pins are the versions the test was
# last run against; the trl extra allows the range they stand for.
source "$(dirname "$0")/common.sh"
make_env trl 3.11
pin trl==1.16.0 transformers==5.24.0 torch==2.15.0 accelerate==1.16.0 datasets==5.2.0
documented pip install ".[trl]"
check_entrypoint trl
install_test_extra trl
