"""Speculative decoding on a mesh of ranks (real gloo process groups): greedy tokens equal one rank
decoding plainly, under expert parallelism (MTP: its module replicated on every rank) and tensor
parallelism (n-gram and MTP: every rank of a TP group offers the same drafts, so the group's ranks
verify the same rows) and both on a TP 2 × EP 2 mesh of four ranks; sampled verification keeps one
draw per TP group when each process's RNG differs, and a seeded request draws what one rank draws."""

import functools
import json

import pytest

from moetune.config import parse_config
from moetune.engine.build import build_generator
from moetune.engine.distributed import run_ranks
from moetune.engine.sampling import SamplingParams
from moetune.model.registry import bundled_asset
from tests.checkpoints import VOCAB, build_checkpoint, build_mtp_checkpoint
from tests.dist import jobs
from tests.engine.driving import mixed_requests


@pytest.fixture(scope="module")
def mtp_checkpoint(tmp_path_factory):
    return build_mtp_checkpoint("deepseek_v3", tmp_path_factory.mktemp("dsv3"), max_position_embeddings=512)


@pytest.fixture(scope="module")
def draft_checkpoint(tmp_path_factory):
    return build_checkpoint("qwen3_moe", tmp_path_factory.mktemp("draft"), shard=False)  # the same 320 tokens


def config(path, speculative=None, parallel=None):
    data = {"model": {"path": str(path), "device": "cpu"}, "parallel": {**(parallel or {}), "timeout_s": 60}}
    return parse_config({**data, "engine": {"speculative": speculative}} if speculative else data)


def plain(path, prompts, max_tokens):
    done = build_generator(config(path)).generate(
        prompts, [SamplingParams(max_tokens=n, ignore_eos=True) for n in max_tokens])
    return [c.token_ids for c in done]


def code_prompts(n: int) -> list[str]:
    lines = bundled_asset("prompts/stdlib-heldout.jsonl").read_text().splitlines()
    return [json.loads(line)["prompt"][:200] for line in lines[:n]]


def run_speculative(path, speculative, parallel, prompts, max_tokens):
    """Greedy tokens on the mesh equal one rank's plain decoding; every rank's counters → returned."""
    job = functools.partial(jobs.speculative_parity, prompts, max_tokens)
    tokens, every = run_ranks(config(path, speculative, parallel), job)
    assert tokens == plain(path, prompts, max_tokens)
    return every


def test_mtp_on_two_expert_parallel_ranks_equals_plain_decoding(mtp_checkpoint):
    reqs = mixed_requests(6, VOCAB, seed=3)
    every = run_speculative(mtp_checkpoint, "mtp:2", {"ep_size": 2}, [p for p, _ in reqs], [n for _, n in reqs])
    assert all(r["draft_tokens"] > 0 and r["verify_steps"] > 0 for r in every)  # each rank drafted for its own


@pytest.mark.parametrize("model, speculative", [("dsv3", "ngram:3"), ("dsv3", "mtp:2"), ("dsv3", "draft"),
                                               ("stdlib-moe", "mtp:2")])
def test_speculation_on_a_tp2_group_equals_one_rank_without_it(mtp_checkpoint, draft_checkpoint, model, speculative):
    """The tiny deepseek_v3 (its own MTP head and embedding; repeated phrases: the n-grams match; a
    tiny qwen3_moe as the draft model, whole on each rank) and the bundled model (its trained MTP
    head on the tied, vocab-split embedding read whole)."""
    if speculative == "draft":
        speculative = f"draft:{draft_checkpoint}:2"
    if model == "dsv3":
        reqs = mixed_requests(4, VOCAB, seed=1)
        path, prompts, max_tokens = mtp_checkpoint, [p for p, _ in reqs], [max(n, 12) for _, n in reqs]
    else:
        path, max_tokens = "stdlib-moe", [24, 16, 20]
        prompts = [build_generator(config(path)).encode(p) for p in code_prompts(3)]
    every = run_speculative(path, speculative, {"tp_size": 2}, prompts, max_tokens)
    assert every[0] == every[1]  # the same drafts offered, the same accepted, on both ranks
    assert every[0]["verify_steps"] > 0 and every[0]["draft_tokens"] > 0
    if speculative == "ngram:3" or model == "stdlib-moe":  # the random MTP head guesses at chance
        assert every[0]["accepted"] > 0


@pytest.mark.parametrize("speculative", ["ngram:3", "mtp:2"])
def test_speculation_on_a_tp2_by_ep2_mesh_equals_one_rank_without_it(mtp_checkpoint, speculative):
    """Four ranks: two DP groups (EP 2, each its own requests and drafts) of two TP ranks (the same
    drafts, the same rows verified). Greedy tokens equal one rank decoding plainly."""
    reqs = mixed_requests(4, VOCAB, seed=1)
    parallel = {"tp_size": 2, "ep_size": 2, "placement": "round_robin"}
    every = run_speculative(mtp_checkpoint, speculative, parallel, [p for p, _ in reqs], [max(n, 12) for _, n in reqs])
    assert len(every) == 4 and every[0] == every[1] and every[2] == every[3]  # ranks 2d, 2d + 1: one TP group
    assert every[0]["drafts"] != every[2]["drafts"]  # each DP group drafted for its own requests
    drafted = [r["verify_steps"] > 0 and r["draft_tokens"] > 0 for r in every]
    assert all(drafted) if speculative == "mtp:2" else any(drafted)  # MTP drafts every step; n-grams where they match


@pytest.mark.parametrize("seed", [7, None])
def test_sampled_draft_model_verify_on_a_tp_group(mtp_checkpoint, draft_checkpoint, seed):
    """Temperature sampling with a draft model (whole on each rank, greedy drafts: the same on both
    ranks) verified by rejection sampling: both ranks keep the same tokens even when each process's
    RNG differs (seed None: the group keeps its rank 0's outcome); seeded requests draw what one rank
    with the same speculator draws (the same per-request generator over the same gathered logits)."""
    reqs = mixed_requests(3, VOCAB, seed=1)
    prompts, speculative = [p for p, _ in reqs], f"draft:{draft_checkpoint}:2"
    cfg = config(mtp_checkpoint, speculative, {"tp_size": 2})
    every = run_ranks(cfg, functools.partial(jobs.sampled_on_every_rank, prompts, seed))
    assert every[0] == every[1] and sorted(every[0]) == [0, 1, 2]
    if seed is not None:
        one = build_generator(config(mtp_checkpoint, speculative)).generate(
            prompts, SamplingParams(max_tokens=12, temperature=1.3, seed=seed, ignore_eos=True))
        assert [every[0][i] for i in range(3)] == [c.token_ids for c in one]


def test_sampled_verification_keeps_one_draw_per_tp_group(mtp_checkpoint):
    """Each process's RNG differs (seed None): the group keeps its rank 0's verify outcome. MTP
    drafts for every decoding sequence and the random head's drafts are mostly rejected, so the
    residual draws (from each process's RNG) would part the ranks without the agreement."""
    reqs = mixed_requests(3, VOCAB, seed=1)
    cfg = config(mtp_checkpoint, "mtp:2", {"tp_size": 2})
    every = run_ranks(cfg, functools.partial(jobs.sampled_on_every_rank, [p for p, _ in reqs], None))
    assert every[0] == every[1] and sorted(every[0]) == [0, 1, 2]


@pytest.mark.parametrize("parallel", [{"tp_size": 2}, {"ep_size": 2}])
def test_a_profile_on_ranks_records_acceptance(tmp_path, parallel):
    """`moetune profile` on a mesh with mtp:1 (the bundled model's trained head): summary.json
    `speculative` sums the DP groups' counters (a TP group's ranks count the same steps once)."""
    from moetune.profile.rundir import read_run
    from moetune.profile.runner import ProfileSettings, run_profile
    from moetune.profile.workload import Workload

    cfg = parse_config({"engine": {"speculative": "mtp:1"}, "parallel": {**parallel, "timeout_s": 60}})
    w = Workload(num_requests=4, batch_size=4, output_len=12, warmup_steps=1)
    s = read_run(run_profile(ProfileSettings(cfg, w, out=tmp_path / "run")).path).summary["speculative"]
    assert s["enabled"] and s["method"] == "mtp:1" and 0 < s["accepted_tokens"] <= s["draft_tokens"] <= s["verified"]
    assert s["draft_expert_layers"] >= s["verify_steps"] > 0
