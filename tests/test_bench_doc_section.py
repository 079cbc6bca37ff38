"""benchmarks/doc_section.py: a benchmark's table lands in its own section of docs/benchmarks.md with
its command, commit, machine and load, and a re-run replaces the section instead of adding a copy."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("doc_section", ROOT / "benchmarks" / "doc_section.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_section_is_written_with_its_provenance_and_replaced_on_a_rerun(tmp_path):
    ds = _module()
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# B\n\nintro\n\n<!-- bench: x -->\nold\n<!-- /bench: x -->\n\n## after\n")
    ds.write_section("x", ds.section("x", "A table", ["| a |", "|---|", "| 1 |"], "1.0", "1.5", ["b.py", "--n", "2"]),
                     doc)
    text = doc.read_text()
    assert "old" not in text and text.count("<!-- bench: x -->") == 1 and text.endswith("## after\n")
    assert "- command: `python b.py --n 2`" in text and "- load: 1.0 before → 1.5 after" in text
    assert "- commit: " in text and "- machine: " in text and "| 1 |" in text
    ds.write_section("y", ds.section("y", "Another", ["| b |"], "1", "1", ["c.py"]), doc)
    ds.write_section("y", ds.section("y", "Another", ["| c |"], "1", "1", ["c.py"]), doc)
    text = doc.read_text()
    assert text.count("<!-- bench: y -->") == 1 and "| c |" in text and "| b |" not in text


def test_the_markers_in_docs_benchmarks_are_there_for_the_speculative_benchmark():
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    assert "<!-- bench: speculative -->" in text and "<!-- /bench: speculative -->" in text
