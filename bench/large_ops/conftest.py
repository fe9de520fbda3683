"""conftest.py of the large-space operator repo (pytest-kope `c` toolchain): nothing is needed here.

Each test module names its operator; plain `pytest` tests the committed kernel, `pytest --kope-optimize`
improves it::

    pytestmark = pytest.mark.kope("conv1d", source="conv1d.c", family="conv")
"""
