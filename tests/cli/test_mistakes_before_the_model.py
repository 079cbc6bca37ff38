"""A speculator the checkpoints refuse, or a prompt longer than the context, answers before any model is
built: no model-loading module, no kernel module, no numba (so nothing compiled) and, where ranks would run,
no rank started, as `python -X importtime` reports every module the process imported. The speculative cases
answer before torch loads too; a prompt is counted by the checkpoint's tokenizer, as the engine will count it."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.cli.bad_input import CASES

IDS = ("speculative-mtp-missing", "speculative-draft-missing", "speculative-draft-other-vocabulary",
       "tp-profile-prompt-too-long", "prompt-longer-than-context")
LONG = "for i in range(10):\n" * 200  # 1,600 tokens of the tiny tokenizer; its context is 256
EXTRA = {  # not in the table (the table is one case per mistake): the prompt refused before ranks or the chat template
    "generate-tp-prompt-longer-than-context": ("generate", "-m", "{ck}", "--tp-size", "2", "-p", LONG),
    "generate-chat-prompt-longer-than-context": ("generate", "-m", "{ck}", "--chat", "-p", LONG),
}
MODEL = ("numba", "moetune.kernels", "moetune.model.loader", "moetune.model.transformer", "moetune.engine.build",
         "moetune.engine.distributed", "moetune.profile.ranks.run")
MODULE = re.compile(r"^import time:\s+\d+ \|\s+\d+ \| *([\w.]+)$")


def _modules_and_said(stderr: str) -> tuple[set[str], list[str]]:
    modules, said = set(), []
    for line in stderr.splitlines():
        m = MODULE.match(line)
        if m:
            modules.add(m.group(1).strip())
        elif not line.startswith("import time:"):
            said.append(line)
    return modules, said


def _run(args: tuple, d, src: dict):
    (d / "tmp").mkdir(exist_ok=True)
    values = {"d": str(d), **{k: str(v) for k, v in src.items()}}
    args = [a.format(**values) if isinstance(a, str) else a for a in args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(d / "tmp"), "COLUMNS": "100"}
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "moetune", *args], capture_output=True, cwd=d,
                         env=env, timeout=120)
    modules, said = _modules_and_said(out.stderr.decode(errors="replace"))
    assert len(said) == 1 and said[0].startswith("error: "), said
    return out.returncode, modules, said[0]


def _built(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in MODEL))


@pytest.mark.parametrize("case", [c for c in CASES if c.id in IDS], ids=lambda c: c.id)
def test_the_mistake_answers_before_the_model(case, checkpoint, tmp_path):
    src = {"ck": checkpoint("qwen3_moe", shard=False)}
    if case.prep is not None:
        case.prep(tmp_path, src)
    code, modules, line = _run(case.args, tmp_path, src)
    assert code == case.code and all(word in line for word in case.words), line
    assert not _built(modules), f"{_built(modules)} imported before: {line}"
    if case.id.startswith("speculative-"):
        assert "torch" not in modules, line


@pytest.mark.parametrize("cid", EXTRA)
def test_a_generate_prompt_is_refused_before_the_ranks_and_after_the_chat_template(cid, checkpoint, tmp_path):
    code, modules, line = _run(EXTRA[cid], tmp_path, {"ck": checkpoint("qwen3_moe", shard=False)})
    assert code == 1 and "the context is 256; shorten the prompt" in line, line
    assert not _built(modules), f"{_built(modules)} imported before: {line}"


def test_a_model_import_is_seen():
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", "import moetune.model.loader"], capture_output=True,
                         text=True, check=True)
    modules, said = _modules_and_said(out.stderr)
    assert said == [] and {"moetune.kernels", "moetune.model.loader"} <= set(_built(modules))


def test_the_cases_are_in_the_table():
    assert {c.id for c in CASES} >= set(IDS)


def test_max_tokens_over_a_recipes_max_model_len_is_refused_not_cut(checkpoint, tmp_path):
    """engine.max_model_len below the model's context: --max-tokens over what it leaves is refused with its
    number (the engine would otherwise cut the output at 100 tokens), before the model."""
    (tmp_path / "r.yaml").write_text("engine:\n  max_model_len: 100\n")
    args = ("generate", "-m", "{ck}", "--recipe", "{d}/r.yaml", "-p", "def f():", "--max-tokens", "150")
    code, modules, line = _run(args, tmp_path, {"ck": checkpoint("qwen3_moe", shard=False)})
    assert code == 1 and "engine.max_model_len's context of 100" in line and "at most 99" in line, line
    assert not _built(modules), f"{_built(modules)} imported before: {line}"


@pytest.mark.parametrize("workload, words", [
    (("--input-len", "90", "--output-len", "20"), "needs 110 positions but engine.max_model_len's context is 100"),
    (("--prompts", "{d}/p.txt", "--num-requests", "1", "--output-len", "20"),
     "plus --output-len 20 exceeds engine.max_model_len's context of 100"),
], ids=["input-len", "prompts"])
def test_a_profile_workload_over_a_recipes_max_model_len_is_refused(workload, words, checkpoint, tmp_path):
    """profile sizes its run by the engine's context (engine.max_model_len cuts the model's 256 to 100): a
    workload over it is refused by that number, before the model (the engine would cut the outputs)."""
    (tmp_path / "r.yaml").write_text("engine:\n  max_model_len: 100\n")
    (tmp_path / "p.txt").write_text("x = 1; " * 25 + "\n")  # ~150 tokens: +20 over 100, under 256
    args = ("profile", "-m", "{ck}", "--recipe", "{d}/r.yaml", *workload)
    code, modules, line = _run(args, tmp_path, {"ck": checkpoint("qwen3_moe", shard=False)})
    assert code == 1 and words in line, line
    assert not _built(modules), f"{_built(modules)} imported before: {line}"
