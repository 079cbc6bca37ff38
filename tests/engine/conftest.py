"""The engine tests' tiny checkpoints: GQA (qwen3_moe) and MLA's latent cache (deepseek_v3); a test
module that defines its own `model` fixture uses that one instead."""

import pytest

from moetune.model.loader import load_model
from tests.checkpoints import build_checkpoint


@pytest.fixture(scope="module", params=["qwen3_moe", "deepseek_v3"])
def model(request, tmp_path_factory):
    path = build_checkpoint(request.param, tmp_path_factory.mktemp(request.param), shard=False,
                            max_position_embeddings=512)
    return load_model(path)
