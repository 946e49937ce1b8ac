"""pip's build backend for lockstep (pyproject.toml's backend-path): meson-python, Debian 12's
python3-mesonpy, builds the wheel. What this adds:

- a Python without meson-python (pyenv's, conda's, a python.org build first on PATH) gets one line
  that says what to do, where pip showed a traceback about `mesonpy`;
- the wheel's metadata is written at once (meson-python 0.12 has no metadata hook, so pip built
  the whole wheel under "Preparing metadata ... still running"): pip then says "Building wheel"
  while Meson builds.
"""
import os
import re
import sys

try:
    import mesonpy
except ImportError:
    mesonpy = None

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _no_mesonpy():
    raise SystemExit(
        f"lockstep: {sys.executable} has no meson-python, which builds lockstep's wheel without "
        "downloading anything: use Debian's Python (tools/setup installs python3-mesonpy): "
        "/usr/bin/python3 -m venv --system-site-packages venv && "
        "venv/bin/pip install --no-build-isolation .")


def _version():
    with open(os.path.join(_ROOT, "meson.build"), encoding="utf-8") as meson:
        found = re.search(r"^  version: '([0-9.]+)',$", meson.read(), re.MULTILINE)
    if not found:
        raise SystemExit("lockstep: meson.build names no version (  version: 'X.Y.Z',)")
    return found.group(1)


def get_requires_for_build_wheel(config_settings=None):
    if mesonpy is None:
        _no_mesonpy()
    return mesonpy.get_requires_for_build_wheel(config_settings)


def get_requires_for_build_sdist(config_settings=None):
    if mesonpy is None:
        _no_mesonpy()
    return mesonpy.get_requires_for_build_sdist(config_settings)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    """The wheel's .dist-info, as the built wheel will carry it (its name and version, which pip
    checks against the wheel's), without building."""
    del config_settings
    if mesonpy is None:
        _no_mesonpy()
    version = _version()
    info = os.path.join(metadata_directory, f"lockstep-{version}.dist-info")
    os.makedirs(info, exist_ok=True)
    with open(os.path.join(info, "METADATA"), "w", encoding="utf-8") as out:
        out.write("Metadata-Version: 2.1\n"
                  "Name: lockstep\n"
                  f"Version: {version}\n"
                  "Summary: Accelerate-style execution control for multi-process programs\n"
                  "License: Apache-2.0\n"
                  "Requires-Python: >=3.9\n")
    return os.path.basename(info)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    del metadata_directory  # meson-python writes its own
    if mesonpy is None:
        _no_mesonpy()
    return mesonpy.build_wheel(wheel_directory, config_settings)


def build_sdist(sdist_directory, config_settings=None):
    if mesonpy is None:
        _no_mesonpy()
    return mesonpy.build_sdist(sdist_directory, config_settings)
