"""`moetune search ... | cat`: the trials table prints each trial on one line (not wrapped at 80 columns),
the deployment in the engines' words; `--format tsv` parses with the csv module; winner.yaml carries the
whole point. Through the installed console script, piped by the shell."""

import csv
import io
import re
import subprocess
import sys
from pathlib import Path

import yaml

from moetune.search.cost.deployment import Deployment
from moetune.search.cost.describe import describe

MOETUNE = Path(sys.executable).parent / "moetune"


def test_a_deployment_in_the_engines_words():
    d = Deployment(ep_size=8, redundant_experts=16, placement="eplb", max_num_seqs=8, max_num_batched_tokens=512,
                   quant_low_format="fp8", dense_format="fp8", kv_format="fp8", cuda_graph_max_bs=512)
    assert describe(d) == ("EP 8, 16 redundant experts, EPLB placement, max 8 seqs, max 512 batched tokens, "
                           "fp8 experts/dense/KV, CUDA graphs ≤ 512")
    assert describe(Deployment()) == "EP 1, max 64 seqs, max 8192 batched tokens"
    mixed = Deployment(ep_size=2, tp_size=2, expert_tp_size=2, replicas=2, quant_low_format="int4",
                       quant_hot_fraction=0.25, kv_format="fp8", offload_resident_fraction=0.5,
                       offload_prefetch_depth=1, capacity_policy="buffer", capacity_factor=1.25, overlap=1,
                       cuda_graph_max_bs=0, speculative="ngram:4", scheduling="affinity")
    assert describe(mixed) == (
        "2 replicas × (EP 2, TP 2, contiguous placement, max 64 seqs, max 8192 batched tokens, int4 experts, "
        "fp8 KV, 25% hottest experts full precision, 50% of experts resident, prefetch 1 layers ahead, "
        "LRU eviction, capacity factor 1.25 (buffer), affinity scheduling, speculative ngram:4, "
        "two-batch overlap, eager (no CUDA graphs))")


def _search(run_dir, out, *extra) -> subprocess.CompletedProcess:
    args = ["--trace", str(run_dir), "--hardware", "8xH200", "--n-trials", "6", "--out", str(out), *extra]
    return subprocess.run(f"'{MOETUNE}' search {' '.join(args)} | cat", shell=True, capture_output=True, text=True,
                          timeout=600, env={"OMP_NUM_THREADS": "1", "MOETUNE_PROGRESS": "off", "PATH": "/usr/bin:/bin"})


def test_piped_search_prints_each_trial_on_one_line(run_dir, tmp_path):
    got = _search(run_dir, tmp_path / "out")
    assert got.returncode == 0, got.stderr
    lines = got.stdout.splitlines()
    title = next(i for i, line in enumerate(lines) if re.match(r"Best \d+ trials", line))
    n = int(lines[title].split()[1])
    header, rows = lines[title + 1], lines[title + 2:title + 2 + n]
    assert header.split()[:2] == ["trial", "deployment"] and n >= 3
    for row in rows:  # one line a trial: its number, the deployment in words, the figures, the label at the end
        assert re.match(r"^\s*\d+", row) and "EP " in row and "batched tokens" in row, row
        assert row.rstrip().endswith("estimated"), row
    assert lines[title + 2 + n] == ""  # the table ends after its n rows: nothing wrapped onto a further line
    winner = (tmp_path / "out" / "winner.yaml").read_text()
    assert re.search(r"^# deployment: .*EP \d+", winner, re.M) and "# every knob of the point:" in winner
    assert "cuda_graph_max_bs=" in winner and yaml.safe_load(winner)  # the comments leave it a recipe


def test_search_format_tsv_parses_with_the_csv_module(run_dir, tmp_path):
    got = _search(run_dir, tmp_path / "out", "--format", "tsv")
    assert got.returncode == 0, got.stderr
    tables = [list(csv.reader(io.StringIO(block), delimiter="\t")) for block in got.stdout.split("\n\n")]
    assert len(tables) >= 2 and all(len(row) == len(t[0]) for t in tables for row in t)
    trials = next(t for t in tables if t[0][:2] == ["trial", "deployment"])
    assert len(trials) >= 4 and all(re.match(r"(\d+ replicas × \()?(EP|attention DP) \d+", row[1])
                                 for row in trials[1:])  # the parallel mesh or a general one (meshes: 2+ GPUs)
    assert "winner.yaml" in got.stderr  # the prose went to stderr
