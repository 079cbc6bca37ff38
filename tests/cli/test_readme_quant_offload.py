"""The quant + offload recipe of docs/experts.md (section "Using it", moved there from the README), read
from the page itself, runs through generate, profile and eval on the bundled model, at small sizes,
through the real console script. Its layers mix formats (hot experts fp32, the rest int4) and are
offloaded."""

import json
import re
from pathlib import Path

import pytest

from tests.cli_run import moetune, moetune_each

README = Path(__file__).resolve().parents[2] / "docs" / "experts.md"
SMALL = ("--num-requests", "2", "--batch-size", "2", "--input-len", "8", "--output-len", "4", "--warmup-steps", "0")


def readme_recipe() -> str:
    section = README.read_text().split("## Using it", 1)[1]
    return re.search(r"```yaml\n(.*?)```", section, re.S).group(1)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A directory holding the README's `runs/loads` (a small profile) and its recipe as written."""
    cwd = tmp_path_factory.mktemp("readme")
    r = moetune("profile", "--out", "runs/loads", *SMALL, cwd=cwd)
    assert r.returncode == 0, r.stderr
    (cwd / "recipe.yaml").write_text(readme_recipe())
    resident = "\n".join(line for line in readme_recipe().split("offload:")[0].splitlines())
    (cwd / "resident.yaml").write_text(resident + "\n")
    return cwd


def test_the_recipe_is_a_mix_of_formats_with_offload():
    text = readme_recipe()
    assert "hot_fraction" in text and "offload:" in text and "loads: runs/loads" in text


def test_generate_with_the_recipe_gives_the_resident_mix_tokens(workdir):
    args = ("--prompt", "def parse(", "--max-tokens", "12", "--ignore-eos")
    offloaded, resident = moetune_each(("generate", "--recipe", "recipe.yaml", *args),
                                       ("generate", "--recipe", "resident.yaml", *args), cwd=workdir)
    assert offloaded.returncode == 0, offloaded.stderr
    assert resident.returncode == 0, resident.stderr
    assert offloaded.stdout == resident.stdout and offloaded.stdout.strip()


def test_profile_with_the_recipe_records_the_offload_and_the_mix(workdir):
    r = moetune("profile", "--recipe", "recipe.yaml", "--out", "runs/mixed", *SMALL, cwd=workdir)
    assert r.returncode == 0, r.stderr
    summary = json.loads((workdir / "runs" / "mixed" / "summary.json").read_text())
    offload = summary["offload"]
    assert offload["enabled"] and 0 < offload["total"]["hit_rate"] <= 1 and offload["layers"]


def test_eval_with_the_recipe_scores_against_the_bundled_model(workdir):
    r = moetune("eval", "--recipe", "recipe.yaml", "--max-windows", "1", "--window", "32", "--num-prompts", "2",
                "--greedy-tokens", "2", "--json", "e.json", cwd=workdir)
    assert r.returncode == 0, r.stderr
    got = json.loads((workdir / "e.json").read_text())
    assert got["agreement"]["kl"] > 0  # int4 experts move the logits
    assert got["perplexity"]["tokens_scored"] > 0
