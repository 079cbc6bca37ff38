"""engine.speculative and prompt-length mistakes refused from the checkpoints alone (engine/speculative/check.py,
engine/limits.py), where the target is resolved: the same lines the speculators and the engine raise once a
model is loaded (tests/engine/test_mtp.py, test_generate.py), here with no model built at all."""

import pytest

from moetune.config import EngineConfig, parse_config
from moetune.engine.limits import max_len_of, prompt_refusal
from moetune.engine.speculative.check import check_speculative
from moetune.engine.target import resolve_target
from moetune.errors import CheckpointError, MoetuneError
from moetune.model.checkpoint import open_checkpoint
from tests.checkpoints import build_checkpoint, build_mtp_checkpoint


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return open_checkpoint(build_checkpoint("qwen3_moe", tmp_path_factory.mktemp("plain"), shard=False))


@pytest.fixture(scope="module")
def with_mtp(tmp_path_factory):
    return open_checkpoint(build_mtp_checkpoint("qwen3_moe", tmp_path_factory.mktemp("mtp"), own_head=False))


@pytest.fixture(autouse=True)
def no_model_loads(monkeypatch):
    """A model build would fail the test: every check here reads config.json and safetensors headers only."""
    import moetune.model.loader as loader

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(loader, "load_model", refuse)
    monkeypatch.setattr(loader, "load_mtp", refuse)


def test_mtp_needs_the_checkpoints_mtp_layer(plain, with_mtp):
    check_speculative("mtp:2", with_mtp)
    with pytest.raises(CheckpointError, match="has no num_nextn_predict_layers: this checkpoint has no MTP layer"):
        check_speculative("mtp:2:auto", plain)


def test_a_draft_must_be_a_checkpoint_with_the_targets_vocabulary(plain, with_mtp, tmp_path):
    check_speculative(f"draft:{plain.model_dir}:3", with_mtp)  # both 320 tokens
    with pytest.raises(CheckpointError, match="^engine.speculative's draft model: model '.*nope' is neither"):
        check_speculative(f"draft:{tmp_path / 'nope'}:2", plain)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="^engine.speculative's draft model: .* has no config.json"):
        check_speculative(f"draft:{tmp_path / 'empty'}:2", plain)
    with pytest.raises(MoetuneError, match="vocabulary has 320 tokens, the target's 8,192: a draft model must share"):
        check_speculative(f"draft:{plain.model_dir}:2", open_checkpoint(None))  # the bundled model's 8,192


def test_ngram_and_none_read_nothing(plain):
    check_speculative(None, plain)
    check_speculative("ngram:4:auto", plain)


def test_resolving_the_target_refuses_them_and_a_new_recipe_is_checked_again(plain):
    cfg = parse_config({"model": {"path": str(plain.model_dir)}})
    target = resolve_target(cfg)
    with pytest.raises(CheckpointError, match="no MTP layer"):
        resolve_target(cfg.model_copy(update={"engine": EngineConfig(speculative="mtp:2")}))
    with pytest.raises(CheckpointError, match="no MTP layer"):
        target.with_config(cfg.model_copy(update={"engine": EngineConfig(speculative="mtp:2")}))


@pytest.mark.parametrize("max_model_len, want", [(None, 256), (100, 100), (4096, 256)])
def test_the_targets_max_len_is_the_engines_rule(plain, max_model_len, want):
    cfg = parse_config({"model": {"path": str(plain.model_dir)}, "engine": {"max_model_len": max_model_len}})
    assert resolve_target(cfg).max_len == max_len_of(cfg.engine, 256) == want


def test_a_prompt_must_leave_room_for_one_token():
    assert prompt_refusal(99, 100) is None
    assert prompt_refusal(100, 100) == "the prompt has 100 tokens but the context is 100; shorten the prompt"
