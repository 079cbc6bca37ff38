"""Workload loading: JSONL or plain-text prompts, cycling, truncation and padding."""

import json

import pytest

from moetune.errors import MoetuneError
from moetune.profile.workload import Workload, batches, load_prompt_texts, request_tokens


def test_jsonl_and_plain_text(tmp_path):
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text("\n".join(json.dumps({"id": i, "prompt": f"p{i}", "source": "x"}) for i in range(3)) + "\n")
    assert load_prompt_texts(jsonl) == ["p0", "p1", "p2"]
    text = tmp_path / "p.txt"
    text.write_text("first\n\nsecond\n")
    assert load_prompt_texts(text) == ["first", "second"]


@pytest.mark.parametrize("content, fragment", [(None, "cannot read"), ("", "no prompts"),
                                               ('{"prompt": "a"}\n{oops\n', "line 2"),
                                               ('{"text": "a"}\n', "'prompt'")])
def test_bad_prompt_files(tmp_path, content, fragment):
    path = tmp_path / "p.jsonl"
    if content is not None:
        path.write_text(content)
    with pytest.raises(MoetuneError, match=fragment):
        load_prompt_texts(path)


def test_requests_cycle_and_fit_input_len():
    encode = lambda text: [ord(c) for c in text]  # noqa: E731
    w = Workload(num_requests=3, input_len=4)
    assert request_tokens(["ab", "abcdef"], encode, w) == [[97, 98, 97, 98], [97, 98, 99, 100], [97, 98, 97, 98]]
    assert request_tokens(["ab"], encode, Workload(num_requests=2)) == [[97, 98], [97, 98]]


def test_batches_and_step_count():
    w = Workload(num_requests=5, batch_size=2, output_len=3)
    assert [len(b) for b in batches(list(range(5)), 2)] == [2, 2, 1]
    assert w.measured_steps() == 3 * 3


def test_ep_size_defaults_to_the_recipe_then_one():
    from moetune.config import parse_config
    from moetune.profile.session import ProfileSettings, parallel_sizes

    recipe = parse_config({"parallel": {"ep_size": 4, "ranks_per_node": 2}})
    assert parallel_sizes(ProfileSettings(recipe)) == (4, 2)
    assert parallel_sizes(ProfileSettings(recipe, ep_size=8)) == (8, 2)
    assert parallel_sizes(ProfileSettings(parse_config({}))) == (1, 1)


def test_ranks_this_command_starts_share_one_node_unless_told(monkeypatch):
    """Two local ranks used to count every byte as inter-node (ranks_per_node defaulted to 1)."""
    from moetune.config import parse_config
    from moetune.profile.session import ProfileSettings, parallel_sizes

    for var in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    plain = parse_config({"parallel": {"ep_size": 4}})
    assert parallel_sizes(ProfileSettings(plain)) == (4, 4)  # spawned here: one node
    assert parallel_sizes(ProfileSettings(plain, ep_size=2)) == (2, 2)
    assert parallel_sizes(ProfileSettings(plain, what_if=True)) == (4, 1)  # a what-if models the recipe's cluster
    assert parallel_sizes(ProfileSettings(plain, ranks_per_node=1)) == (4, 1)  # the flag wins
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert parallel_sizes(ProfileSettings(plain)) == (4, 2)  # torchrun: its ranks per node
