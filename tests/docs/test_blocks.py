"""The docs extractor and runner catch what they are for: a broken command anywhere in a block fails
it, markers are read (and a wrong one refused), set-up steps and ports are handled as documented."""

import pytest

from tests.docs.blocks import MarkerError, Runner, extract, script

DOC = """# t

## One
```bash
moetune models
```

<!-- docs-test: skip needs a GPU -->
```bash
moetune tune-kernels
```

```yaml
not: run
```

## Two
<!-- docs-test: after-install -->
```bash
python3 -m venv .venv && . .venv/bin/activate && pip install -e ".[serve]" && echo installed
```

```python
print("hi")
```
"""


def test_blocks_are_found_with_their_markers_sections_and_lines():
    blocks = extract(DOC, "t.md")
    assert [(b.line, b.lang, b.mode, b.section) for b in blocks] == [
        (4, "bash", "run", "One"), (9, "bash", "skip", "One"), (19, "bash", "after-install", "Two"),
        (23, "python", "run", "Two")]
    assert blocks[1].reason == "needs a GPU"
    assert script(blocks[2], 9999) == "set -euo pipefail\necho installed\n"


def test_the_port_of_the_docs_becomes_the_runners():
    block = extract("```bash\ncurl localhost:8000/v1/models\nmoetune serve --port 8000 &\n```\n", "t.md")[0]
    assert script(block, 4321).splitlines()[1:] == ["curl localhost:4321/v1/models", "moetune serve --port 4321 &"]


@pytest.mark.parametrize("text, words", [
    ("<!-- docs-test: skipp x -->\n```bash\nls\n```\n", "unknown docs-test comment"),
    ("<!-- docs-test: skip -->\n```bash\nls\n```\n", "needs a reason"),
    ("<!-- docs-test: skip x -->\n\n```bash\nls\n```\n", "right above a fenced block"),
    ("<!-- docs-test: server -->\n```yaml\na: 1\n```\n", "never runs"),
    ("```bash\nls\n", "never closed"),
])
def test_a_wrong_marker_is_refused_with_its_line(text, words):
    with pytest.raises(MarkerError, match=words):
        extract(text, "t.md")


def test_a_broken_command_in_the_middle_of_a_block_fails_it(tmp_path):
    doc = "```bash\nmoetune models\nmoetune profile --no-such-flag 3\necho the last command succeeds\n```\n"
    runner = Runner(tmp_path)
    broken = runner.run(extract(doc, "t.md")[0])
    assert not broken.ok and broken.returncode == 2 and "--no-such-flag" in broken.output
    fine = runner.run(extract(doc.replace("profile --no-such-flag 3", "--help"), "t.md")[0])
    assert fine.ok, fine.output


def test_a_failing_pipe_and_an_error_answer_fail_a_block(tmp_path):
    runner = Runner(tmp_path)
    assert not runner.run(extract("```bash\nfalse | cat\n```\n", "t.md")[0]).ok
    assert not runner.run(extract("```bash\necho '{\"error\": {\"message\": \"bad\"}}'\n```\n", "t.md")[0]).ok
    assert not runner.run(extract("```python\nraise SystemExit(3)\n```\n", "t.md")[0]).ok
