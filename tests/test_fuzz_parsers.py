"""Property-based fuzzing (hypothesis) of the two parsers a user feeds files to: recipes and prompts.

Whatever the bytes, each parser either returns a well-formed result or raises a one-line
`MoetuneError` subclass; nothing else escapes.
"""

import json
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from moetune.cli.options import run_config
from moetune.config import RunConfig
from moetune.errors import MoetuneError, RecipeError
from moetune.profile.workload import load_prompt_texts

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SECTIONS = ("name", "model", "parallel", "quant", "offload", "engine", "serve", "bogus")
KEYS = ("path", "dtype", "device", "kernel_backend", "ep_size", "ranks_per_node", "experts", "per_expert",
        "enabled", "resident_experts", "max_batch_size", "max_model_len", "host", "port", "typo")
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
                    st.text(max_size=12), st.sampled_from(["fp32", "bf16", "cpu", "auto", "torch", "int4"]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.sampled_from(KEYS), inner, max_size=3), max_leaves=8)
recipes = st.dictionaries(st.sampled_from(SECTIONS), st.dictionaries(st.sampled_from(KEYS), values, max_size=4)
                          | scalars, max_size=5)


def _write(data: bytes, suffix: str) -> Path:
    handle = tempfile.NamedTemporaryFile(suffix=suffix, delete=False)
    with handle:
        handle.write(data)
    return Path(handle.name)


def _one_line(exc: MoetuneError) -> None:
    assert str(exc).strip() and "\n" not in str(exc).strip()


def _parse_recipe(data: bytes):
    path = _write(data, ".yaml")
    try:
        return run_config(None, str(path))  # the CLI's path: file checks, YAML, keys, flags on top
    except RecipeError as exc:
        _one_line(exc)
        return None
    finally:
        path.unlink()


@FUZZ
@given(st.binary(max_size=300))
@example(b"\xff\xfe")
@example(b"a: &x [*x]\n")
@example(b"!!python/object:os.system {}\n")
@example(b"model: {path: [1, 2]}\n")
def test_recipe_parser_takes_any_bytes(data):
    cfg = _parse_recipe(data)
    assert cfg is None or isinstance(cfg, RunConfig)


@FUZZ
@given(st.text(max_size=300))
def test_recipe_parser_takes_any_text(text):
    cfg = _parse_recipe(text.encode("utf-8"))
    assert cfg is None or isinstance(cfg, RunConfig)


@FUZZ
@given(recipes)
def test_recipe_parser_takes_any_structure(data):
    cfg = _parse_recipe(yaml.safe_dump(data).encode("utf-8"))
    assert cfg is None or isinstance(cfg, RunConfig)


def _parse_prompts(data: bytes, suffix: str):
    path = _write(data, suffix)
    try:
        return load_prompt_texts(path)
    except MoetuneError as exc:
        _one_line(exc)
        return None
    finally:
        path.unlink()


@FUZZ
@given(st.binary(max_size=300), st.sampled_from([".jsonl", ".txt"]))
@example(b'{"prompt": "\\ud800"}\n', ".jsonl")
@example(b"{\n", ".txt")
@example(b"\x00\n", ".txt")
def test_prompts_parser_takes_any_bytes(data, suffix):
    texts = _parse_prompts(data, suffix)
    if texts is not None:
        assert texts and all(isinstance(t, str) for t in texts)
        for t in texts:
            t.encode("utf-8")  # every prompt is text the tokenizer can take


any_text = st.text(alphabet=st.characters(blacklist_categories=()), max_size=40)  # surrogates included


@FUZZ
@given(st.lists(any_text, min_size=1, max_size=6))
def test_prompts_jsonl_round_trips_or_refuses(prompts):
    data = "".join(json.dumps({"prompt": p}) + "\n" for p in prompts).encode("ascii")
    texts = _parse_prompts(data, ".jsonl")
    encodable = all(_encodes(p) for p in prompts)
    assert (texts == prompts) if encodable else texts is None


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False
