import pytest
import torch

from moetune.model.loader import load_model
from tests.conftest import MODEL_TYPES
from tests.forward import prompt_hidden


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_bf16_weights_track_fp32_logits(model_type, checkpoint):
    path = checkpoint(model_type)
    prompt = torch.randint(3, 300, (9,), generator=torch.Generator().manual_seed(0))
    logits = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = load_model(path, dtype=dtype)
        assert model.embed.dtype == dtype and model.experts.weights(model.spec.moe_layers[0]).w13.data.dtype == dtype
        logits[dtype] = model.logits(prompt_hidden(model, [prompt.tolist()]))
    ref = logits[torch.float32]
    err = (logits[torch.bfloat16] - ref).abs().max() / ref.abs().max()
    assert err < 0.05, f"{model_type}: bf16 relative error {err:.3f}"


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_weight_bytes_account_for_every_checkpoint_tensor_once(model_type, checkpoint):
    from safetensors import safe_open

    path = checkpoint(model_type)
    in_files = 0
    for file in path.glob("*.safetensors"):
        with safe_open(str(file), "pt") as handle:
            in_files += sum(handle.get_tensor(n).numel() * 4 for n in handle.keys())  # saved in fp32
    parts = load_model(path).weight_bytes()
    assert parts["experts"] > 0 and parts["experts"] + parts["dense"] == in_files
