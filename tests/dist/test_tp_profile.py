"""`moetune profile --tp-size 2 --ep-size 2` (4 real gloo ranks): every rank is measured, the run dir
states the mesh, each rank's tensor-parallel bytes per lock-step × layer equal the ones computed
from its tokens, and the report renders the per-rank collective table."""

import json

import pandas as pd
import pytest

from tests.checkpoints import CONFIGS, VOCAB, build_checkpoint
from tests.cli_run import moetune


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = build_checkpoint("qwen2_moe", tmp_path_factory.mktemp("qwen2_moe"), shard=False)
    out = tmp_path_factory.mktemp("runs") / "tp2ep2"
    got = moetune("profile", "-m", str(path), "--device", "cpu", "--tp-size", "2", "--ep-size", "2",
                  "--num-requests", "4", "--batch-size", "4", "--input-len", "12", "--output-len", "3",
                  "--warmup-steps", "1", "-o", str(out), "--report")
    assert got.returncode == 0, got.stderr
    return out


def computed_bytes(layer: int, phase: str, tokens: int, batch: int) -> int:
    """qwen2_moe tiny: layers 1 and 3 are dense (decoder_sparse_step 2, mlp_only_layers [3]), 0 and 2
    MoE; with tp_size = expert_tp_size = 2 every layer all-reduces twice (attention, then its MLP)."""
    D = CONFIGS["qwen2_moe"]["hidden_size"]
    if phase == "tp_allreduce":
        return 2 * tokens * D * 4
    if phase == "tp_embed":
        return tokens * D * 4
    assert phase == "tp_gather"
    return batch * VOCAB * 4  # every sequence samples: static batches, whole prompts in one step


def test_every_rank_is_measured_and_the_mesh_stated(run):
    summary = json.loads((run / "summary.json").read_text())
    mesh = summary["parallel"]["mesh"]
    assert (mesh["world"], mesh["ep_size"], mesh["tp_group"]) == (4, 2, 2)
    assert mesh["rank_coords"] == {"0": [0, 0], "1": [0, 1], "2": [1, 0], "3": [1, 1]}
    steps = pd.read_parquet(run / "rank_steps.parquet")
    assert sorted(steps["rank"].unique()) == [0, 1, 2, 3]
    tp = pd.read_parquet(run / "rank_tp.parquet")
    assert sorted(tp["rank"].unique()) == [0, 1, 2, 3]
    # the run's own tables count each DP group's tokens once: 4 prompts of 12 tokens in the prefill
    assert pd.read_parquet(run / "steps.parquet").query("kind == 'prefill'")["tokens"].sum() == 4 * 12


def test_tp_bytes_per_rank_step_and_layer_equal_the_computed_ones(run):
    tp = pd.read_parquet(run / "rank_tp.parquet")
    assert set(tp["phase"]) == {"tp_allreduce", "tp_embed", "tp_gather"}
    assert set(tp.query("phase == 'tp_allreduce'")["layer"]) == {0, 1, 2, 3}
    for row in tp.itertuples():
        assert row.bytes == computed_bytes(row.layer, row.phase, row.tokens, row.batch), row
        assert row.calls == (2 if row.phase == "tp_allreduce" else 1)
    # both ranks of a TP group moved the same bytes; the two groups served different requests
    by_rank = tp.groupby("rank")["bytes"].sum()
    assert by_rank[0] == by_rank[1] and by_rank[2] == by_rank[3] and by_rank.sum() > 0


def test_the_report_shows_per_rank_collectives(run):
    md = (run / "report.md").read_text()
    assert "Tensor-parallel collectives per rank" in md
    for rank, coords in enumerate(["DP 0, TP 0", "DP 0, TP 1", "DP 1, TP 0", "DP 1, TP 1"]):
        assert f"rank {rank} ({coords})" in md
