"""interp.data.slices, the one function that cuts a sequence into windows, against torch's own unfold."""
import pytest
import torch

import interp


@pytest.mark.parametrize("n, length, stride", [(21, 8, None), (24, 8, None), (20, 6, 2), (9, 4, 3), (5, 8, None)])
def test_whole_windows_are_torch_unfold(n, length, stride):
    ids = torch.arange(100, 100 + n)
    got = interp.data.slices(ids, length, stride, drop_last=True)
    want = list(ids.unfold(0, length, stride or length)) if n >= length else []
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))


def test_the_tail_is_kept_shorter_and_every_id_appears_once_without_overlap():
    ids = list(range(21))
    got = interp.data.slices(ids, 8)
    assert got == [ids[0:8], ids[8:16], ids[16:21]]
    assert interp.data.slices(ids, 21) == [ids] and interp.data.slices(ids, 50) == [ids]
    # with an overlap the last window is the one that reaches the end, not a shorter copy of its tail
    assert interp.data.slices(list(range(7)), 4, stride=2) == [[0, 1, 2, 3], [2, 3, 4, 5], [4, 5, 6]]


@pytest.mark.parametrize("bad", [dict(length=0), dict(length=2.0), dict(length=True), dict(length=3, stride=0)])
def test_a_bad_length_or_stride_is_refused_by_name(bad):
    name = "stride" if "stride" in bad else "length"
    with pytest.raises(ValueError, match=f"slices: {name} must be an integer >= 1"):
        interp.data.slices(list(range(10)), **bad)
