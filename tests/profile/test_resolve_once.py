"""One `moetune profile` resolves the model, reads its config.json into a ModelSpec and validates its
safetensors headers once: the command runs in this process through typer's app (no subprocess) with
a counter on each of the three (the functions they go through: `registry.bundled_models`, which
`resolve_model` looks a name up in; `adapters.spec_from_config`, which `read_spec` ends in;
`validate.checkpoint_tensors`, which reads every header for `validate_checkpoint`)."""

import pytest
import typer.main

import moetune.model.adapters as adapters
import moetune.model.registry as registry
import moetune.model.validate as validate


def _count(monkeypatch, counts: dict, module, name: str) -> None:
    original = getattr(module, name)

    def counted(*args, **kwargs):
        counts[name] += 1
        return original(*args, **kwargs)

    counts[name] = 0
    monkeypatch.setattr(module, name, counted)


@pytest.mark.parametrize("extra", [[], ["--ep-size", "7", "--what-if"]])  # E = 7
def test_one_profile_resolves_reads_and_validates_once(checkpoint, tmp_path, monkeypatch, extra):
    from moetune.cli.main import app

    counts: dict = {}
    for module, name in ((registry, "bundled_models"), (adapters, "spec_from_config"),
                         (validate, "checkpoint_tensors")):
        _count(monkeypatch, counts, module, name)
    out = tmp_path / "run"
    args = ["profile", "-m", str(checkpoint("qwen3_moe")), "--num-requests", "2", "--batch-size", "2",
            "--output-len", "3", "--warmup-steps", "1", "--kernel-backend", "torch", "--out", str(out), *extra]
    typer.main.get_command(app).main(args, prog_name="moetune", standalone_mode=False)
    assert (out / "summary.json").is_file()  # the profile ran to the end
    assert counts == {"bundled_models": 1, "spec_from_config": 1, "checkpoint_tensors": 1}
