"""olmoe's q/k RMSNorm over the whole projection when the attention heads are split over a TP group.

One rank holds q [T, H/G·Dh] and k [T, Hkv_local·Dh] of its heads and the matching slices of the
two norm weights (model/tp_shards.py). The root mean square is over the whole projection, so each
rank sums the squares of its part and one all-reduce of [T, 2] (q's sums, k's) adds them over the
group; a KV head held by several ranks (Hkv < G: G/Hkv copies, model/tp.py `kv_heads`) has its
sum divided by its copies first, so it counts once. Then every rank scales its part as the one-rank
RMSNorm (`model/norm.py`, fp32) scales the whole. The all-reduce is counted with the layer's
`tp_allreduce` bytes and calls; its time falls inside the `attention` phase.
"""

from __future__ import annotations

import torch

from moetune.model.norm import RMSNorm
from moetune.model.tp import TPComm


class SplitQKNorm:
    def __init__(self, layer: int, q_norm: RMSNorm, k_norm: RMSNorm, comm: TPComm, q_size: int, k_size: int,
                 k_copies: int):
        """q_size, k_size: the whole projections' widths (H·Dh, Hkv·Dh); k_copies: ranks holding each KV head."""
        self.layer, self.q_norm, self.k_norm, self.comm = layer, q_norm, k_norm, comm
        self.q_size, self.k_size, self.k_copies = q_size, k_size, k_copies

    def __call__(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q [T, H/G·Dh], k [T, Hkv_local·Dh] → both normed over the whole projection."""
        q32, k32 = q.float(), k.float()
        sums = torch.stack([q32.pow(2).sum(-1), k32.pow(2).sum(-1) / self.k_copies], dim=1)  # [T, 2]
        self.comm.all_reduce(sums, self.layer)
        q32 = q32 * torch.rsqrt(sums[:, :1] / self.q_size + self.q_norm.eps)  # [T, H/G·Dh]
        k32 = k32 * torch.rsqrt(sums[:, 1:] / self.k_size + self.k_norm.eps)  # [T, Hkv_local·Dh]
        return self.q_norm.weight * q32.to(q.dtype), self.k_norm.weight * k32.to(k.dtype)


def split_qk_norm(layer: int, q_norm: RMSNorm, k_norm: RMSNorm, comm: TPComm, num_heads: int, num_kv_heads: int,
                  head_dim: int) -> SplitQKNorm:
    """The split norm of layer `layer`; heads: the whole model's."""
    G = comm.plan.size
    copies = G // num_kv_heads if num_kv_heads < G else 1
    return SplitQKNorm(layer, q_norm, k_norm, comm, num_heads * head_dim, num_kv_heads * head_dim, copies)
