"""The maintainers' tooling tests (tooling/tests/, run by `make test` beside tests/): the test support package
(tests/support/, imported as `support`) importable, as tests/conftest.py makes it for tests/."""
import os
import sys

TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tests")
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)
