"""The README fits a reader: short prose lines, one short row per command, the details in docs/; the
architecture page is structure, not a log (measurements live in docs/benchmarks.md)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _prose_and_code(text: str) -> tuple[list[str], list[str]]:
    prose, code, inside = [], [], False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside
            continue
        (code if inside else prose).append(line)
    return prose, code


def test_readme_lines_are_short_outside_code_and_bounded_inside():
    prose, code = _prose_and_code((ROOT / "README.md").read_text())
    long = [line for line in prose if len(line) > 100]
    assert not long, f"README lines over 100 characters outside code blocks: {long[:3]}"
    assert all(len(line) <= 200 for line in code)
    assert len(prose) + len(code) < 200


def test_readme_links_resolve():
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#]+)\)", text)
    assert len(links) >= 10 and all((ROOT / link).exists() for link in links), links


def test_architecture_is_structure_under_450_lines_without_dated_measurements():
    text = (ROOT / "docs" / "architecture.md").read_text()
    assert len(text.splitlines()) < 450
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), "a dated measurement: it belongs in docs/benchmarks.md"
    assert "tok/s" not in text
