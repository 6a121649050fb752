"""t2sql's PEP 517 build backend: maturin's, after one check that cargo is on PATH.

Without cargo, maturin's backend asks the installer for `puccinialin`, which downloads rustup and a whole
Rust toolchain (about 730 MB) into a temporary directory, silently, and throws it away after the build.
Here the first hook any installer calls (get_requires_for_build_*) stops instead, with one line saying what
to install; nothing is downloaded, maturin included (pyproject's build-system.requires is empty: maturin
is asked for only once cargo is found). Every hook then hands over to maturin's as it is.
"""

from __future__ import annotations

import os
import shutil
import sys

MATURIN = "maturin>=1.5,<2"
NEEDS_RUST = ("t2sql: building t2sql compiles its grading core from Rust, and cargo is not on PATH: install a Rust "
              "toolchain (https://rustup.rs), open a new shell so cargo is on PATH, and run the install again")


def _check_cargo() -> None:
    if shutil.which("cargo") is None:
        print(NEEDS_RUST, file=sys.stderr, flush=True)
        raise SystemExit(1)
    # This backend stands in front of maturin's on purpose: maturin's warning about it says nothing to a user.
    os.environ.setdefault("MATURIN_NO_MISSING_BUILD_BACKEND_WARNING", "1")


def _maturin():
    _check_cargo()
    import maturin  # noqa: PLC0415 - only once cargo is found: the installer fetched it for this hook

    return maturin


def get_requires_for_build_wheel(config_settings=None):
    _check_cargo()
    return [MATURIN]


def get_requires_for_build_editable(config_settings=None):
    _check_cargo()
    return [MATURIN]


def get_requires_for_build_sdist(config_settings=None):
    _check_cargo()
    return [MATURIN]


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    return _maturin().prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    return _maturin().prepare_metadata_for_build_editable(metadata_directory, config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _maturin().build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _maturin().build_editable(wheel_directory, config_settings, metadata_directory)


def build_sdist(sdist_directory, config_settings=None):
    return _maturin().build_sdist(sdist_directory, config_settings)
