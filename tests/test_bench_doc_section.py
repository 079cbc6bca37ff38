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


def _bench_vs_llamacpp():
    spec = importlib.util.spec_from_file_location("bench_vs_llamacpp", ROOT / "benchmarks" / "bench_vs_llamacpp.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_vs_llamacpp_writes_its_tables_into_docs_cpu_between_their_markers():
    bench = _bench_vs_llamacpp()
    assert bench.CPU_DOC == ROOT / "docs" / "cpu.md"
    text = bench.CPU_DOC.read_text()
    for key in ("vs-llamacpp-avx2", "vs-llamacpp-avx512-vnni"):  # the AVX2-emulated and the AVX-512 host's
        assert text.count(f"<!-- bench: {key} -->") == 1 and text.count(f"<!-- /bench: {key} -->") == 1


def test_bench_vs_llamacpp_times_the_workloads_asked_for():
    wanted = _bench_vs_llamacpp()._wanted
    assert wanted("prefill b=1 len=512", "prefill,b=1") and wanted("decode b=1", "b=1")
    assert not wanted("decode b=16", "prefill,b=1") and not wanted("prefill b=1 len=512", "b=1,b=16")


def test_bench_vs_llamacpp_names_the_build_flags_a_venv_was_built_with_not_the_ones_asked_for_now(tmp_path):
    bench = _bench_vs_llamacpp()
    assert bench.built_with(tmp_path) == f"{tmp_path} (build flags not recorded)"
    (tmp_path / bench.BUILT_WITH).write_text("-DGGML_NATIVE=OFF -DGGML_AVX2=ON\n")
    assert bench.built_with(tmp_path) == f"{tmp_path}, CMAKE_ARGS -DGGML_NATIVE=OFF -DGGML_AVX2=ON"
