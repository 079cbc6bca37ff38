"""Run directories carry a schema version; the profile sizes memory by the batch it really ran."""

import json

import pytest

from moetune.cli.footprint import kv_bytes
from moetune.config import parse_config
from moetune.errors import RunDirError
from moetune.profile.reader import SCHEMA_VERSION, RunReader
from moetune.profile.rundir import read_run
from moetune.profile.runner import ProfileSettings, run_profile
from moetune.profile.workload import Workload


@pytest.fixture(scope="module")
def oversized_batch_run(checkpoint, tmp_path_factory):
    """--batch-size 100000 with 2 requests (the issue's `profile --batch-size 100000` with few requests)."""
    cfg = parse_config({"model": {"path": str(checkpoint("qwen3_moe", shard=False))}})
    work = Workload(num_requests=2, batch_size=100000, input_len=8, output_len=3, warmup_steps=0)
    return run_profile(ProfileSettings(cfg, work, out=tmp_path_factory.mktemp("reader") / "run"))


def test_summary_json_starts_with_the_schema_version(oversized_batch_run):
    raw = json.loads((oversized_batch_run.path / "summary.json").read_text())
    assert next(iter(raw)) == "schema_version" and raw["schema_version"] == SCHEMA_VERSION
    assert read_run(oversized_batch_run.path).summary["schema_version"] == SCHEMA_VERSION


def test_the_kv_cache_is_sized_by_the_real_batch_not_the_requested_one(oversized_batch_run, checkpoint):
    from moetune.model.loader import read_spec

    summary = oversized_batch_run.summary
    assert summary["workload"]["batch_size"] == 100000  # what was asked is still recorded
    spec = read_spec(checkpoint("qwen3_moe", shard=False))
    # the pool: one 16-token block for each of the 2 real sequences (8 + 3 tokens), plus the null block
    assert summary["memory"]["kv_cache_bytes"] == kv_bytes(spec, slots=2 + 1, max_len=16, dtype_bytes=4)


def test_every_file_goes_through_the_reader(oversized_batch_run, tmp_path):
    reader = RunReader(oversized_batch_run.path)
    assert reader.table("steps").shape[0] > 0 and reader.trace("routing.npz").num_steps > 0
    with pytest.raises(RunDirError, match="nope.json"):
        reader.json("nope.json")
