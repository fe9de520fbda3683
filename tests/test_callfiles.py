"""The differential check's streams: read back as saved, and only as the layouts the reader already
knows, whatever a candidate's child wrote into them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pytest_kope.judge.child import callfiles


def test_arrays_read_back_as_written_in_the_layouts_given(tmp_path):
    arrays = {
        "0-0-a1": np.arange(6, dtype=np.float32).reshape(2, 3).T,  # not contiguous
        "0-1-a1": np.full(5, 7.0),
        "1-0-a2": np.zeros((0, 4), np.int64),  # empty
        "2-0-a0": np.float64(2.5),  # zero-dimensional
    }
    stream = callfiles.Stream(tmp_path, "outputs")
    for name, a in arrays.items():
        stream.write(name, a)
    stream.close()
    back = callfiles.read(tmp_path, "outputs", {name: callfiles.layout(a) for name, a in arrays.items()})
    for name, a in arrays.items():
        assert back[name].dtype == a.dtype and back[name].shape == np.shape(a)
        np.testing.assert_array_equal(back[name], a)
    with pytest.raises(ValueError):  # read-only views: a replay copies them into its own buffers
        back["0-1-a1"][0] = 1


@pytest.mark.parametrize(
    "index, payload, why",
    [
        ([["0-0-a1", 24]], 24, "unknown entry"),  # a name the reader does not expect
        ([["0-0-a0", 16]], 16, "not the 24"),  # fewer bytes than the layout has
        ([["0-0-a0", 24]], 32, "past what"),  # bytes no entry names
        ([["0-0-a0", 24]], 8, "ends after 8"),  # the index claims more than the stream holds
        ({"0-0-a0": 24}, 24, "unknown entry"),  # not a list at all
        ([["0-0-a0"]], 24, "unknown entry"),
        ([["0-0-a0", 24.0]], 24, "unknown entry"),  # a size that is not a whole number of bytes
        ([["0-0-a0", True]], 24, "unknown entry"),
    ],
)
def test_a_stream_that_does_not_add_up_is_refused(tmp_path, index, payload, why):
    (tmp_path / "outputs.json").write_text(json.dumps(index))
    (tmp_path / "outputs.bin").write_bytes(b"\0" * payload)
    with pytest.raises(ValueError, match=why):
        callfiles.read(tmp_path, "outputs", {"0-0-a0": ((3,), np.dtype(np.float64))})


def test_no_stream_at_all_is_nothing(tmp_path):
    assert callfiles.read(tmp_path, "outputs", {"0-0-a0": ((3,), np.dtype(np.float64))}) == {}


def test_an_index_nested_past_the_parser_is_refused(tmp_path):
    (tmp_path / "outputs.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="not a list"):
        callfiles.read(tmp_path, "outputs", {})
