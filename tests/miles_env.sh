#!/usr/bin/env bash
# The environment tests/test_miles_integration.py runs in: miles' Python from a source checkout,
# on CPU. Only PyPI packages are installed here; miles and Megatron-LM themselves are checkouts you
# point at (nothing of theirs is built or copied):
#
#   git clone https://github.com/radixark/miles ../miles              # last run against 31f1ca9
#   git clone https://github.com/radixark/Megatron-LM ../Megatron-LM  # last run against 2e64d788b
#   tests/miles_env.sh                  # makes .venv-miles (about 6 GB: torch pulls CUDA wheels)
#   MILES_SRC=../miles MEGATRON_SRC=../Megatron-LM .venv-miles/bin/python -m pytest tests/test_miles_integration.py
#
# VENV and PYTHON (a CPython >= 3.10; miles' image uses 3.12, this was run with 3.11) may be set.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv-miles}"
PY="${PYTHON:-python3}"

"$PY" -m venv "$VENV"
"$VENV/bin/pip" install --quiet --upgrade pip
# miles' import-time dependencies (torch from PyPI runs on CPU).
"$VENV/bin/pip" install \
  torch==2.11.0 transformers==5.12.1 numpy tiktoken pydantic pyyaml omegaconf pybase64 httpx jinja2 \
  blobfile "ray[default]" "sglang-router>=0.2.3" aiohttp openai==2.6.1 pillow psutil IPython fastapi \
  uvicorn orjson msgspec partial_json_parser pyzmq setproctitle einops requests interegular \
  prometheus-client python-multipart scipy distro datasets uvloop polars==1.42.1 pylatexenc \
  apache-tvm-ffi==0.1.11 ninja sentencepiece accelerate miles-tito-tokenizers==0.1.1
# Imported by miles but never run here: without their own dependencies.
"$VENV/bin/pip" install --no-deps sglang==0.5.16 torchvision==0.26.0 xgrammar==0.2.1 compressed-tensors loguru gguf
# t2sql itself with its test extras (builds the Rust core: a minute or two, silently).
"$VENV/bin/pip" install -e ".[test]"
echo "ready: MILES_SRC=<miles checkout> MEGATRON_SRC=<Megatron-LM checkout> $VENV/bin/python -m pytest tests/test_miles_integration.py"
