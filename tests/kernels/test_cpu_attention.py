"""Paged decode attention (numba) against its torch twin and against attention over the plain
context: block tables in any order, context lengths of 1 and across block edges, GQA ratios,
sliding windows, a pool full of NaN outside the used rows, head sizes that take the 16-position
tiles (`_simd_attention`) and ones that do not, tiles that end mid-block and past the context."""

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("numba")

from moetune.kernels.cpu import decode_attention, decode_attention_ref  # noqa: E402
from moetune.kernels.cpu import runtime  # noqa: E402


def case(lens: list[int], H: int, Hkv: int, Dh: int, block: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    B = len(lens)
    nb = max(-(-n // block) for n in lens) + 1  # one spare column of padding (block 0)
    rows = (B * nb + 1) * block
    k_pool = torch.full((rows, Hkv, Dh), float("nan"))
    v_pool = torch.full((rows, Hkv, Dh), float("nan"))
    tables = torch.zeros(B, nb, dtype=torch.long)
    ids = (torch.randperm(B * nb, generator=g) + 1).tolist()
    ctx_k, ctx_v = [], []
    for b, n in enumerate(lens):
        k = torch.randn(n, Hkv, Dh, generator=g)
        v = torch.randn(n, Hkv, Dh, generator=g)
        for j in range(-(-n // block)):
            blk = ids.pop()
            tables[b, j] = blk
            part = slice(j * block, min(n, (j + 1) * block))
            start = blk * block
            k_pool[start : start + part.stop - part.start] = k[part]
            v_pool[start : start + part.stop - part.start] = v[part]
        ctx_k.append(k)
        ctx_v.append(v)
    q = torch.randn(B, H, Dh, generator=g)
    return q, k_pool, v_pool, tables, torch.tensor(lens), ctx_k, ctx_v


def plain(q, ctx_k, ctx_v, scale, window):
    """Each sequence over its own unpaged context (the definition)."""
    out = []
    for b, (k, v) in enumerate(zip(ctx_k, ctx_v)):
        if window:
            k, v = k[-window:], v[-window:]
        o = F.scaled_dot_product_attention(q[b][None, :, None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                           scale=scale, enable_gqa=True)  # [1, H, 1, Dh]
        out.append(o[0, :, 0])
    return torch.stack(out)


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("lens,H,Hkv,Dh,block,window", [
    ([1], 4, 4, 8, 4, 0),  # one sequence, one cached token
    ([5, 17, 16, 1], 6, 2, 16, 4, 0),  # across block edges, GQA 3:1
    ([33, 2], 8, 1, 32, 16, 0),  # multi-query
    ([40, 3, 12], 4, 2, 8, 8, 7),  # sliding window shorter and longer than contexts
    ([129, 40, 16, 17], 12, 4, 64, 16, 0),  # 16-position tiles (Dh a multiple of 16): full and partial
    ([70, 33, 1], 6, 2, 80, 5, 23),  # tiles across blocks of 5, a window not on a tile or block edge
    ([1, 17, 32], 4, 4, 16, 3, 0),  # one vector per row, one-position tile
    ([50, 9], 8, 2, 24, 16, 10),  # Dh not a multiple of 16: the plain loops, windowed
])
def test_decode_attention_matches_twin_and_definition(lens, H, Hkv, Dh, block, window, parallel, monkeypatch):
    if parallel:
        monkeypatch.setattr(runtime, "SERIAL_BYTES", 0)
    q, k_pool, v_pool, tables, ctx, ctx_k, ctx_v = case(lens, H, Hkv, Dh, block)
    scale = Dh**-0.5
    got = decode_attention(q, k_pool, v_pool, tables, ctx, block, scale, window, threads=2 if parallel else 1)
    assert not got.isnan().any()  # the NaN outside the used rows is never read
    want = plain(q, ctx_k, ctx_v, scale, window)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    k0 = torch.nan_to_num(k_pool)  # the twin gathers whole blocks: padding must be finite for SDPA
    v0 = torch.nan_to_num(v_pool)
    torch.testing.assert_close(decode_attention_ref(q, k0, v0, tables, ctx, block, scale, window), want,
                               rtol=1e-5, atol=1e-5)


def test_decode_attention_empty_batch_and_bad_input():
    q, k_pool, v_pool, tables, ctx, _, _ = case([3], 4, 2, 8, 4)
    assert decode_attention(q[:0], k_pool, v_pool, tables[:0], ctx[:0], 4, 1.0).shape == (0, 4, 8)
    with pytest.raises(ValueError, match="context length"):
        decode_attention(q, k_pool, v_pool, tables, torch.tensor([99]), 4, 1.0)
    with pytest.raises(ValueError, match="fp32"):
        decode_attention(q.double(), k_pool, v_pool, tables, ctx, 4, 1.0)
    with pytest.raises(ValueError, match="do not fit"):
        decode_attention(q[:, :3], k_pool, v_pool, tables, ctx, 4, 1.0)


def test_a_plan_made_once_serves_every_layer_and_is_checked():
    """A decode step makes the plan once (tables, lengths, scratch) and passes it to each layer: two
    calls on different pools through one plan equal the calls that make their own."""
    from moetune.kernels.cpu import attention as A

    q, k_pool, v_pool, tables, ctx, _, _ = case([5, 17, 16, 1], 6, 2, 16, 4)
    k0, v0 = torch.nan_to_num(k_pool), torch.nan_to_num(v_pool)
    plan = A.decode_plan(tables, ctx, 4, 0, 6, 2, 16)
    for kp, vp in ((k0, v0), (v0 * 2, k0 - 1)):  # the second call reuses the first one's scratch
        want = decode_attention(q, kp, vp, tables, ctx, 4, 0.25)
        torch.testing.assert_close(decode_attention(q, kp, vp, tables, ctx, 4, 0.25, plan=plan), want)
    with pytest.raises(ValueError, match="plan was made for other"):
        decode_attention(q, k0, v0, tables, ctx, 4, 0.25, window=3, plan=plan)
    with pytest.raises(ValueError, match="plan was made for other"):
        decode_attention(q[:2], k0, v0, tables[:2], ctx[:2], 4, 0.25, plan=plan)
