"""tune-kernels: the CPU refusal, routing recording, and the shared-BLOCK_M choice (no GPU needed)."""

import subprocess
import sys

import pytest
import torch

from moetune.bench.kernel_tuning import record_routing, tune_kernels
from moetune.errors import MoetuneError
from moetune.kernels.configs import GemmConfig
from moetune.kernels.tuning import best_pair, candidates
from moetune.model.loader import load_model


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_refuses_without_cuda(tmp_path):
    with pytest.raises(MoetuneError, match="tune-kernels needs a CUDA device; none found"):
        tune_kernels(str(tmp_path))


def test_best_pair_shares_block_m():
    a16, b16 = GemmConfig(block_m=16, block_n=64), GemmConfig(block_m=16, block_n=128)
    a64, b64 = GemmConfig(block_m=64, block_n=64), GemmConfig(block_m=64, block_n=128)
    up = {a16: 1.0, b16: 1.2, a64: 0.5, b64: 0.6}  # w13 alone prefers BLOCK_M 64
    down = {a16: 0.3, b16: 0.2, a64: 2.0, b64: 1.9}  # but the pair is faster at 16
    assert best_pair(up, down) == (a16, b16)


def test_candidate_space_is_valid():
    space = candidates("small")
    assert len(space) == len(set(space)) and {c.block_m for c in space} == {16, 32, 64, 128}


def test_record_routing_via_probe(checkpoint):
    net = load_model(checkpoint("qwen3_moe"), kernel_backend="torch")
    routing = record_routing(net, torch.arange(3, 40), chunk=16)
    assert sorted(routing) == [i for i, layer in enumerate(net.layers) if hasattr(layer.mlp, "store")]
    ids = next(iter(routing.values()))
    assert ids.shape == (37, net.spec.moe.router.top_k) and net.probe is None


def test_importing_moetune_does_not_import_triton():
    code = ("import sys, moetune, moetune.moe.layer, moetune.moe.backend, moetune.model.loader, "
            "moetune.cli.tune_kernels, moetune.kernels.configs; assert 'triton' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
