"""Rotary cos/sin come from a table kept per dtype: the values of the direct formula, any positions."""

import torch

from moetune.model.rope import Rotary
from moetune.spec import RopeSpec


def _direct(rotary: Rotary, positions: torch.Tensor, dtype: torch.dtype):
    freqs = positions[:, None].float() * rotary.inv_freq[None, :]  # [T, rot_dim/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [T, rot_dim]
    return (emb.cos() * rotary.scale).to(dtype), (emb.sin() * rotary.scale).to(dtype)


def test_table_rows_equal_the_formula_and_the_table_grows():
    rotary = Rotary(RopeSpec(theta=10000.0, dim=16, kind="yarn", factor=4.0, original_max_position=64,
                             mscale=1.0, mscale_all_dim=0.7), torch.device("cpu"))
    for positions, end in ((torch.tensor([0, 5, 17, 3]), 18), (torch.tensor([300, 0, 4095]), 4096),
                           (torch.tensor([], dtype=torch.long), 0)):
        for dtype in (torch.float32, torch.bfloat16):
            got, want = rotary.cos_sin(positions, dtype, end), _direct(rotary, positions, dtype)
            for a, b in zip(got, want):
                assert a.dtype == dtype and a.shape == (positions.shape[0], 16)
                torch.testing.assert_close(a, b, rtol=0, atol=1e-6 if dtype == torch.float32 else 1e-2)
    assert rotary._tables[torch.float32][0].shape[0] >= 4096
