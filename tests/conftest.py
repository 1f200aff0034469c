import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(autouse=True)
def _reset_meshprof():
    import meshprof

    meshprof.reset()
    yield
    meshprof.reset()
