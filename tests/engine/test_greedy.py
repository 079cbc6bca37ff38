"""greedy_tokens: the same ids as torch's argmax (the first maximum of each row), on the numpy path
(fp32 CPU) and the torch path (other dtypes)."""

import torch

from moetune.engine.sampling import greedy_tokens


def _awkward_rows() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(6, 1001, generator=g)  # [S, V], V odd
    rows[1, 7] = rows[1, 500] = rows[1].max() + 1  # a tie: the first wins
    rows[2] = 0.0  # every entry tied
    rows[3, 900] = float("nan")  # a NaN counts as the maximum
    rows[4] = float("-inf")
    rows[4, 1000] = -1e30  # the last column
    rows[5, :] = -5.0
    return rows


def test_greedy_tokens_equal_torchs_argmax():
    rows = _awkward_rows()
    want = rows.argmax(dim=-1).tolist()
    assert want[1] == 7 and want[2] == 0 and want[3] == 900 and want[4] == 1000
    assert greedy_tokens(rows) == want
    assert greedy_tokens(rows[:1]) == want[:1]  # one row (a batch-1 decode step)
    assert greedy_tokens(rows[:, ::2]) == rows[:, ::2].argmax(dim=-1).tolist()  # strided
    assert greedy_tokens(rows.bfloat16()) == rows.bfloat16().argmax(dim=-1).tolist()  # (the torch path)
    assert greedy_tokens(rows[:0]) == []
