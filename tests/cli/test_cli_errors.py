"""User mistakes: one line on stderr, non-zero exit, no traceback, nothing half-written."""

import json
import shutil

from safetensors.torch import load_file, save_file

from tests.cli_run import assert_one_line_error, moetune


def test_missing_model_directory(tmp_path):
    assert_one_line_error(moetune("generate", "--model", str(tmp_path / "nope"), "--prompt", "x"), "nope")


def test_unsupported_model_type_lists_the_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    result = moetune("generate", "--model", str(tmp_path), "--prompt", "x")
    assert_one_line_error(result, "llama", "deepseek_v3", "mixtral", "olmoe", "qwen2_moe", "qwen3_moe")


def test_a_missing_tensor_is_named(tmp_path, checkpoint):
    src = checkpoint("olmoe", shard=False)
    dst = tmp_path / "broken"
    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    del tensors["model.layers.1.mlp.experts.3.up_proj.weight"]
    save_file(tensors, str(dst / "model.safetensors"))
    result = moetune("generate", "--model", str(dst), "--prompt", "x")
    assert_one_line_error(result, "model.layers.1.mlp.experts.3.up_proj.weight")


def test_a_prompt_longer_than_the_context(checkpoint):
    result = moetune("generate", "--model", str(checkpoint("mixtral")), "--prompt", "for i in range(10):\n" * 200)
    assert_one_line_error(result, "context")


def test_a_bad_recipe_key_is_named(tmp_path, checkpoint):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"model:\n  path: {checkpoint('mixtral')}\n  dtpye: fp32\n")
    assert_one_line_error(moetune("generate", "--recipe", str(recipe), "--prompt", "x"), "model.dtpye")


def test_an_impossible_recipe_value_is_named(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("parallel:\n  ep_size: 0\n")
    assert_one_line_error(moetune("generate", "--recipe", str(recipe), "--prompt", "x"), "parallel.ep_size")


def test_an_ep_size_that_does_not_divide_the_experts(tmp_path, checkpoint):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"model:\n  path: {checkpoint('mixtral')}\nparallel:\n  ep_size: 2\n")
    assert_one_line_error(moetune("generate", "--recipe", str(recipe), "--prompt", "x"), "--ep-size 2", "5 experts")


def test_generate_streams_only_the_completion_to_stdout(checkpoint):
    path = checkpoint("qwen3_moe")
    result = moetune("generate", "--model", str(path), "--prompt", "def add(a, b):", "--max-tokens", "8",
                     "--ignore-eos", "--temperature", "0")
    assert result.returncode == 0, result.stderr
    from moetune.config import RunConfig
    from moetune.engine.build import build_generator
    from moetune.engine.sampling import SamplingParams

    gen = build_generator(RunConfig(model={"path": str(path)}))
    expected = gen.generate(["def add(a, b):"], SamplingParams(max_tokens=8, ignore_eos=True))[0].text
    assert result.stdout == expected + "\n"

