"""PendingRows: new rows' initial values queued for a device table."""

import numpy as np

from sparseflow.embed.pending_rows import PendingRows


def test_pop_takes_everything_in_order_and_empties_the_queue():
    pending = PendingRows(2)
    pending.push(np.array([4, 1]), np.array([[1, 1], [2, 2]]))
    pending.push(np.array([7]), np.array([[3, 3]]))
    assert len(pending) == 3
    rows, values = pending.pop()
    assert rows.tolist() == [4, 1, 7] and rows.dtype == np.int32
    np.testing.assert_array_equal(values, [[1, 1], [2, 2], [3, 3]])
    rows, values = pending.pop()
    assert rows.shape == (0,) and values.shape == (0, 2) and len(pending) == 0


def test_a_row_queued_twice_keeps_its_latest_values():
    pending = PendingRows(1)
    pending.push(np.array([5, 6]), np.array([[1.0], [2.0]]))
    pending.push(np.array([5]), np.array([[9.0]]))   # row 5 evicted and reused
    rows, values = pending.pop()
    assert dict(zip(rows.tolist(), values[:, 0].tolist())) == {5: 9.0, 6: 2.0}
    assert len(set(rows.tolist())) == rows.shape[0]
