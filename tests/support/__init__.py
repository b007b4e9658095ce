"""The test suite's support (not tests): what the tests share and what builds their models.

- exactness.py: exact enumeration of a tiny model's images, the chi-square test against it, the exactness cases
  (also gpu-check's exactness stage, tooling/gpu_check/exactness.py), pytest-side helpers (`mark_long`,
  `use_drafter`)
- conformance.py: what every `ARImageModel` adapter must satisfy (each family's tests run it)
- node_harness.py, comfy_stubs.py: ComfyUI without ComfyUI for the node tests (the `comfy` fixture)
- tiny_glm_image.py, floor_models.py: tiny model folders in the released layouts (`make test-floor`, the
  real-ComfyUI checks)

The tests import the product as `specar` (a checkout's editable install or an installed wheel) and this package as
`support` (tests/conftest.py puts tests/ on sys.path); nothing else of the checkout. The tiny random-weight models
themselves are the product's (specar.model_loaders.tiny: the commands' `tiny:` models). A test reads the product's
files from PACKAGE and the checkout's (docs, pyproject.toml) from CHECKOUT, marked `needs_checkout`.
"""
import os

import pytest

import specar

PACKAGE = os.path.dirname(os.path.abspath(specar.__file__))  # the product's files: a checkout or an installed copy
SPECAR_PARENT = os.path.dirname(PACKAGE)  # PYTHONPATH for a subprocess that runs the same `specar`
_ABOVE_TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# the checkout the tests sit in (docs/, README.md, pyproject.toml, Makefile: not in a wheel), or None
CHECKOUT = _ABOVE_TESTS if os.path.isfile(os.path.join(_ABOVE_TESTS, "pyproject.toml")) else None
needs_checkout = pytest.mark.skipif(CHECKOUT is None, reason="reads the checkout's files (docs, pyproject.toml, "
                                    "Makefile), which an installed package lacks")
