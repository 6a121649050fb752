#!/usr/bin/env bash
# The environment tests/frameworks/test_skyrl.py runs in: SkyRL 0.4.0's own generator (SkyRLGymGenerator)
# and SkyRL-Gym 0.4.0 from PyPI, on CPU, with this checkout's t2sql[skyrl,test] (docs/skyrl.md).
#
#   tests/envs/skyrl.sh      # makes .venv-skyrl in the checkout root (about 5 GB: torch pulls CUDA wheels)
#
# skyrl 0.4.0 needs Python >= 3.12 (PYTHON may name one). Nothing of vLLM or the FSDP/Megatron trainers is
# installed: they need GPUs, and the test drives the generator with a scripted inference client.
source "$(dirname "$0")/common.sh"

# pyenv's shims refuse an interpreter pyenv has not selected, so python3.12 may be installed yet not on
# PATH: ask pyenv for its lowest 3.12+ (as find_python prefers the lowest) when nothing on PATH will do.
if [ -z "${PYTHON:-}" ] && ! find_python 3.12 >/dev/null 2>&1 && command -v pyenv >/dev/null 2>&1; then
  for version in $(pyenv versions --bare | grep -E '^3\.(1[2-9])\.[0-9]+$' | sort -V); do
    PYTHON="$(PYENV_VERSION="$version" pyenv which python3 2>/dev/null)" && break
  done
fi

make_env skyrl 3.12
# The framework, exactly as the test was run. skyrl 0.4.0 declares aiohttp, orjson, pybase64, loguru and
# jaxtyping only under its CUDA-pinned extras, yet its generator, inference client and validate_cfg import
# them; torch is its generator's import too (PyPI's wheel runs on CPU). transformers: skyrl 0.4.0 allows
# 5.6.1-5.16.1.
env_install skyrl==0.4.0 skyrl-gym==0.4.0 torch==2.15.0 transformers==5.16.1 \
  aiohttp==3.14.5 orjson==3.13.0 pybase64==1.5.1 loguru==0.7.3 jaxtyping==0.3.11
install_t2sql skyrl
