"""The build backend (pyproject.toml's build-system): setuptools', run on a temporary writable copy of the source
tree when the tree itself is read-only (an installed, mounted or packaged checkout): setuptools writes
dsrope.egg-info beside pyproject.toml while it builds a wheel or an sdist, and fails where it cannot.
Editable installs build in the tree, which is then writable by definition of an editable checkout."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

from setuptools import build_meta
from setuptools.build_meta import *  # noqa: F403 (every hook not wrapped here is setuptools' own)

# what a build never reads: VCS data, caches, outputs
NOT_COPIED = shutil.ignore_patterns(".git", ".nox", ".whl", "out", "__pycache__", "*.egg-info", ".venv")


@contextlib.contextmanager
def writable_tree():
    """The current directory when writable; else a writable copy of it, entered for the build. A tree whose
    folder has no write bit is read-only here even for root (who could write it): one behaviour for all."""
    if os.access(".", os.W_OK) and os.stat(".").st_mode & 0o222:
        yield
        return
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "source")
        shutil.copytree(here, copy, ignore=NOT_COPIED)
        for root, _, _ in os.walk(copy):  # copytree keeps the read-only modes of the folders
            os.chmod(root, 0o755)
        os.chdir(copy)
        try:
            yield
        finally:
            os.chdir(here)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    wheel_directory = os.path.abspath(wheel_directory)
    metadata_directory = metadata_directory and os.path.abspath(metadata_directory)
    with writable_tree():
        return build_meta.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_sdist(sdist_directory, config_settings=None):
    sdist_directory = os.path.abspath(sdist_directory)
    with writable_tree():
        return build_meta.build_sdist(sdist_directory, config_settings)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    metadata_directory = os.path.abspath(metadata_directory)
    with writable_tree():
        return build_meta.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def get_requires_for_build_wheel(config_settings=None):
    with writable_tree():
        return build_meta.get_requires_for_build_wheel(config_settings)


def get_requires_for_build_sdist(config_settings=None):
    with writable_tree():
        return build_meta.get_requires_for_build_sdist(config_settings)
