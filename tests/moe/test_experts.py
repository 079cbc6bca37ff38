from contextlib import contextmanager

import torch
import torch.nn.functional as F

from moetune.experts.store import ExpertWeights, ResidentExpertStore
from moetune.spec import MoESpec, RouterSpec
from moetune.moe.experts import run_experts
from moetune.moe.layer import MoELayer
from moetune.moe.permute import permute
from moetune.probe import PHASES


def _weights(E=5, D=8, I=6):
    return ExpertWeights.dense(torch.randn(E, 2 * I, D), torch.randn(E, D, I))


def _per_token_reference(x, ids, w: ExpertWeights):
    I, w13, w2 = w.intermediate_size, w.w13.data, w.w2.data
    rows = []
    for t in range(x.shape[0]):
        for e in ids[t].tolist():
            h = w13[e] @ x[t]
            rows.append(w2[e] @ (F.silu(h[:I]) * h[I:]))
    return torch.stack(rows)  # [T*K, D] in copy order


def test_grouped_gemm_matches_a_per_token_loop_with_an_empty_expert():
    w = _weights()
    x = torch.randn(7, 8)
    ids = torch.tensor([[0, 1], [1, 3], [3, 0], [0, 1], [4, 1], [0, 3], [1, 0]])  # expert 2 unused
    perm = permute(x, ids, 5)
    out = run_experts(perm.x_sorted, perm.offsets, w)
    assert perm.counts.tolist() == [5, 5, 0, 3, 1]
    ref = _per_token_reference(x, ids, w)[perm.sorted_copy_ids]
    torch.testing.assert_close(out.y, ref, rtol=1e-5, atol=1e-5)


class RecordingProbe:
    def __init__(self):
        self.calls = []

    @contextmanager
    def phase(self, layer, name):
        self.calls.append(name)
        yield

    def routed(self, layer, route, perm, block_m):
        self.calls.append(("routed", tuple(perm.counts.tolist())))

    def moved(self, layer, dispatch_bytes, combine_bytes):
        self.calls.append(("moved", dispatch_bytes, combine_bytes))


def test_moe_layer_runs_the_phases_in_order_and_reports_routing():
    E, D = 4, 8
    spec = MoESpec(num_experts=E, intermediate_size=6, router=RouterSpec(top_k=2))
    layer = MoELayer(0, spec, torch.randn(E, D), None, ResidentExpertStore({0: _weights(E, D, 6)}))
    x = torch.randn(3, D)
    plain = layer(x)
    probe = RecordingProbe()
    layer.probe = probe
    probed = layer(x)
    assert torch.equal(plain, probed)
    assert probe.calls[:-2] == ["router", "offload_wait", *PHASES[1:]]
    assert probe.calls[-2][0] == "routed" and sum(probe.calls[-2][1]) == 6
    assert probe.calls[-1] == ("moved", 0, 0)  # one rank: the local dispatcher moves nothing
