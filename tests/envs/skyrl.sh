#!/usr/bin/env bash
# The environment tests/frameworks/test_skyrl.py runs in: SkyRL 0.4.0's own generator (SkyRLGymGenerator)
# and SkyRL-Gym 0.4.0 from PyPI, on CPU, with this checkout's t2sql[skyrl,test] (docs/skyrl.md).
#
#   tests/envs/skyrl.sh      # makes .venv-skyrl in the checkout root (about 5 GB: torch pulls CUDA wheels)
#
# skyrl 0.4.0 needs Python >= 3.12 (PYTHON may name one). Nothing of vLLM or the FSDP/Megatron trainers is
# installed: they need GPUs, and the test drives the generator with a scripted inference client. The skyrl
# extra alone (what docs/skyrl.md installs) carries what the integration imports, skyrl's undeclared
# aiohttp, orjson, pybase64, loguru, jaxtyping and ray included: the pins are the versions the test was last
# run with (transformers: skyrl 0.4.0 allows 5.6.1-5.16.1; ray: the one skyrl's own trainer extra pins).
source "$(dirname "$0")/common.sh"

make_env skyrl 3.12
pin skyrl==0.4.0 skyrl-gym==0.4.0 torch==2.15.0 transformers==5.16.1 \
  aiohttp==3.14.5 orjson==3.13.0 pybase64==1.5.1 loguru==0.7.3 jaxtyping==0.3.11 ray==2.57.0
documented pip install ".[skyrl]"
check_entrypoint skyrl
install_test_extra skyrl
