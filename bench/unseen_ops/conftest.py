"""conftest.py of the unseen operator repo (pytest-kope `c` toolchain): nothing is needed here.

Each test module names its operator; plain `pytest` tests the committed kernel, `pytest --kope-optimize`
improves it::

    pytestmark = pytest.mark.kope("logsoftmax", source="logsoftmax.c", family="rowwise")
"""
