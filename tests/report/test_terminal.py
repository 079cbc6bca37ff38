"""report/terminal.py, the one way a command's tables reach stdout: rich on a terminal, one line per row
at natural width when piped, TSV that the csv module reads; a bad --format is one line before anything."""

import csv
import io

import pytest

from moetune.errors import UsageError
from moetune.report.table import Table
from moetune.report.terminal import Printer, plain_lines, tsv_text

LONG = "EP 8, 16 redundant experts, EPLB placement, max 8 seqs, max 512 batched tokens, fp8 experts/dense/KV, CUDA graphs ≤ 512"
TABLE = Table("Best 2 trials", ["trial", "deployment", "throughput", "how"],
              [["3", LONG, "12,345", "estimated"], ["10", "EP 1,\tmax 8\nseqs", "9.5", "estimated"]], "a note")


def test_piped_a_row_is_one_line_however_long_its_cells():
    lines = plain_lines(TABLE)
    assert lines[0] == "Best 2 trials" and lines[-1] == "a note" and len(lines) == 5
    header, first, second = lines[1:4]
    assert LONG in first and "\n" not in second and "\t" not in second
    assert first.index("12,345") + len("12,345") == header.index("throughput") + len("throughput")  # numbers right
    assert first.index(LONG) == header.index("deployment") == second.index("EP 1,")  # text left, one column


def test_tsv_parses_with_the_csv_module_cell_for_cell():
    rows = list(csv.reader(io.StringIO(tsv_text(TABLE)), delimiter="\t"))
    assert rows == [TABLE.columns, *TABLE.rows]


def test_the_printer_writes_plain_lines_to_a_pipe_and_tsv_blocks_apart(capsys):
    out = io.StringIO()
    Printer("text", out).table(TABLE)
    assert out.getvalue().splitlines()[2].split()[0] == "3" and LONG in out.getvalue()
    out = io.StringIO()
    printer = Printer("tsv", out)
    printer.table(TABLE)
    printer.line("a prose line")
    printer.table(Table("t", ["a", "b"], [["1", "2"]]))
    first, second = out.getvalue().split("\n\n")
    assert list(csv.reader(io.StringIO(second), delimiter="\t")) == [["a", "b"], ["1", "2"]]
    assert len(list(csv.reader(io.StringIO(first), delimiter="\t"))) == 3
    assert capsys.readouterr().err == "a prose line\n"  # stdout holds the tables alone


def test_on_a_terminal_the_table_is_rich_folded_to_its_width():
    out = io.StringIO()
    Printer("text", out, terminal=True).table(TABLE)
    text = out.getvalue()
    assert "┃" in text or "│" in text  # a drawn table
    assert "12,345" in text


def test_an_unknown_format_is_a_usage_error():
    with pytest.raises(UsageError, match="--format 'csv' is not one of text, tsv"):
        Printer("csv")


def test_through_the_cli_piped_tsv_and_a_bad_format():
    from tests.cli_run import assert_one_line_error, moetune

    piped = moetune("models")
    assert piped.returncode == 0 and piped.stdout.splitlines()[0].split() == ["name", "path", "description"]
    assert piped.stdout.splitlines()[1].startswith("stdlib-moe (default)")  # one line a model, not a drawn box
    tsv = moetune("models", "--format", "tsv")
    rows = list(csv.reader(io.StringIO(tsv.stdout), delimiter="\t"))
    assert rows[0] == ["name", "path", "description"] and all(len(r) == 3 for r in rows) and len(rows) >= 2
    assert_one_line_error(moetune("models", "--format", "csv"), "--format 'csv'", "text, tsv")
