import json

import pytest

from moetune.config import parse_config
from moetune.profile.runner import ProfileSettings, run_profile
from moetune.profile.workload import Workload

WORKLOAD = Workload(num_requests=8, batch_size=4, input_len=32, output_len=6, warmup_steps=1)


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory):
    """A profile run of the bundled model (small workload): the trace every search test replays."""
    cfg = parse_config({"model": {"path": "stdlib-moe", "device": "cpu"}})
    out = tmp_path_factory.mktemp("search-runs") / "stdlib"
    return run_profile(ProfileSettings(cfg, WORKLOAD, out=out)).path


@pytest.fixture(scope="session")
def big_config(tmp_path_factory):
    """A DeepSeek-V3-shaped config.json, shrunk in depth (for --scale-model tests)."""
    cfg = {"model_type": "deepseek_v3", "vocab_size": 129280, "hidden_size": 7168, "num_hidden_layers": 6,
           "first_k_dense_replace": 1, "intermediate_size": 18432, "moe_intermediate_size": 2048,
           "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 8,
           "topk_group": 4, "num_attention_heads": 128, "num_key_value_heads": 128, "q_lora_rank": 1536,
           "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
           "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 10000, "routed_scaling_factor": 2.5,
           "scoring_func": "sigmoid", "topk_method": "noaux_tc", "norm_topk_prob": True, "tie_word_embeddings": False}
    path = tmp_path_factory.mktemp("scale") / "config.json"
    path.write_text(json.dumps(cfg))
    return path
