"""The vLLM and SGLang launches of a search winner: every command parses with the engine's own
argument parser (rebuilt from the flag tables dumped from vLLM 0.33.0 and SGLang 0.5.23), deploys
what was priced where the engine can, and says what it cannot (re-priced without)."""

import itertools
import json
from dataclasses import replace

import pytest

from moetune.config import parse_speculative
from moetune.search.cost.deployment import Deployment
from moetune.search.study.emit import launch_text
from moetune.search.study.flag_table import check, commands_of
from moetune.search.study.launch import ServeTarget
from moetune.search.study.sglang_launch import sglang_launch
from moetune.search.study.vllm_launch import vllm_launch

QWEN3 = ServeTarget("Qwen/Qwen3-30B-A3B", "qwen3_moe", 1, 8, "H200")
MIXTRAL = ServeTarget("$MODEL_DIR", "mixtral", 1, 8, "H200")
DSV3 = ServeTarget("deepseek-ai/DeepSeek-V3", "deepseek_v3", 8, 8, "H200")


def launches(d, t):
    return [vllm_launch(d, t), sglang_launch(d, t, "/out/winner.placement.sglang.json")]


def flags(argv) -> dict:
    out, i = {}, 0
    while i < len(argv):
        if argv[i].startswith("-"):
            has_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
            out[argv[i]] = argv[i + 1] if has_value else True
            i += 2 if has_value else 1
        else:
            i += 1
    return out


GRID = [Deployment(ep_size=r, tp_size=g, expert_tp_size=e, replicas=n, placement=p,
                   redundant_experts=16 if p == "eplb" else 0, quant_low_format=q, quant_hot_fraction=h,
                   offload_resident_fraction=0.5 if q == "int4" else 1.0)
        for r, (g, e), n, p, (q, h) in itertools.product(
            (1, 2, 8, 16), ((1, 1), (2, 1), (2, 2), (8, 8)), (1, 4), ("contiguous", "round_robin", "eplb"),
            (("none", 0.0), ("fp8", 0.25), ("int8", 0.0), ("int4", 0.125)))]


@pytest.mark.parametrize("target", [QWEN3, MIXTRAL, DSV3], ids=lambda t: t.model_type)
def test_every_emitted_command_parses_with_the_engines_own_parser(target):
    seen = 0
    for d in GRID:
        for launch in launches(d, target):
            text = launch_text(launch, target, d.label(), {"output_tok_s": 1.0, "estimated": True})
            cmds = commands_of(text)
            assert len(cmds) == len(launch.nodes) >= 1
            for argv in cmds:  # as written in the file: quoting and placeholders included
                assert check(launch.engine, argv) is None, (d, argv)
                seen += 1
            assert "speculative" not in text.lower() and "DRAFT_DIR" not in text  # off: nothing emitted
    assert seen >= 2 * len(GRID)


def test_the_table_parser_refuses_what_the_engines_refuse():
    assert "unrecognized" in check("vllm", ["m", "--expert-parallel-size", "2"])  # not a vLLM flag
    assert "invalid choice" in check("vllm", ["m", "--quantization", "int4"])
    assert "invalid int" in check("sglang", ["--model-path", "m", "--tp-size", "two"])
    assert "deprecated" in check("sglang", ["--model-path", "m", "--enable-dp-attention"])
    assert "invalid choice" in check("sglang", ["--model-path", "m", "--moe-a2a-backend", "nccl"])


def test_a_two_node_expert_parallel_winner_launches_on_each_node():
    d = Deployment(ep_size=16, max_num_seqs=128, max_num_batched_tokens=4096)
    v, s = launches(d, DSV3)
    assert len(v.nodes) == 2 and len(s.nodes) == 2
    head, other = flags(v.nodes[0]), flags(v.nodes[1])
    assert head["--data-parallel-size"] == "16" and head["--data-parallel-size-local"] == "8"
    assert head["--data-parallel-address"] == "$HEAD_IP" and "--headless" not in head
    assert other["--headless"] is True and other["--data-parallel-start-rank"] == "8"
    assert head["--all2all-backend"] == "deepep_high_throughput" and "--enable-expert-parallel" in head
    for k, argv in enumerate(s.nodes):
        f = flags(argv)
        assert (f["--nnodes"], f["--node-rank"], f["--dist-init-addr"]) == ("2", str(k), "$HEAD_IP:5000")
        assert (f["--tp-size"], f["--ep-size"], f["--attn-dp-size"], f["--moe-a2a-backend"]) == ("16", "16", "16", "deepep")
        assert f["--max-running-requests"] == str(128 * 16)  # SGLang divides it among its DP-attention groups
    text = launch_text(v, DSV3, d.label(), None)
    assert 'NODE_RANK="${NODE_RANK:?' in text and 'if [ "$NODE_RANK" = 1 ]; then' in text


def test_quantization_deploys_where_an_online_flag_exists_and_is_repriced_where_not():
    int8 = Deployment(ep_size=8, quant_low_format="int8")
    v, s = launches(int8, QWEN3)
    assert flags(v.nodes[0])["--quantization"] == "experts_int8" and not v.unsupported
    assert "--quantization" not in flags(s.nodes[0]) and s.as_run.quant_low_format == "none" and s.unsupported
    int4 = Deployment(ep_size=8, quant_low_format="int4", quant_hot_fraction=0.25)
    for launch in launches(int4, QWEN3):
        assert "--quantization" not in flags(launch.nodes[0]) and launch.as_run.quant_low_format == "none"
        assert any("int4" in u for u in launch.unsupported)
    mixed = Deployment(ep_size=8, quant_low_format="fp8", quant_hot_fraction=0.25)
    for launch in launches(mixed, QWEN3):
        assert flags(launch.nodes[0])["--quantization"] == "fp8"
        assert launch.as_run.quant_hot_fraction == 0 and any("hot experts" in u for u in launch.unsupported)


def test_placement_only_where_the_engine_honours_it_for_that_model():
    rr = Deployment(ep_size=8, placement="round_robin")
    v = vllm_launch(rr, QWEN3)  # no expert groups: vLLM falls back to linear
    assert "--expert-placement-strategy" not in flags(v.nodes[0]) and v.as_run.placement == "contiguous"
    v = vllm_launch(rr, DSV3)
    f = flags(v.nodes[0])
    assert f["--expert-placement-strategy"] == "round_robin" and f["--all2all-backend"] == "deepep_low_latency"
    assert not v.unsupported and v.as_run.placement == "round_robin"
    s = sglang_launch(rr, QWEN3, "/x.json")
    assert flags(s.nodes[0])["--init-expert-location"] == "/x.json" and s.as_run.placement == "round_robin"


def test_dp_attention_only_for_models_sglang_has_it_for_and_replicas_as_data_parallelism():
    d = Deployment(ep_size=4, replicas=2)
    assert flags(sglang_launch(d, QWEN3, None).nodes[0])["--attn-dp-size"] == "4"
    mixtral = sglang_launch(d, MIXTRAL, None)
    f = flags(mixtral.nodes[0])
    assert "--attn-dp-size" not in f and f["--dp-size"] == "2" and mixtral.instances == 1
    assert sglang_launch(d, QWEN3, None).instances == 2  # attention DP and --dp-size do not combine
    one = vllm_launch(replace(d, ep_size=1, replicas=8), QWEN3)
    assert flags(one.nodes[0])["--data-parallel-size"] == "8" and one.instances == 1
    assert vllm_launch(d, QWEN3).instances == 2


def test_a_search_emits_launch_files_that_parse_and_say_what_is_not_as_priced(run_dir, tmp_path):
    from moetune.search.study.optuna_study import StudySettings
    from moetune.search.study.run import SearchSettings, run_search
    from moetune.search.study.setup import Inputs

    space = tmp_path / "space.yaml"  # the winner has int4 experts: neither engine deploys them
    space.write_text("ep_size: 2\nquant_low_format: int4\nquant_hot_fraction: 0\noffload_resident_fraction: 1\n"
                     "replicas: 1\n")
    out = tmp_path / "out"
    st = StudySettings("s", f"sqlite:///{out / 'study.db'}", ("throughput",), "tpe", 3, 0)
    run_search(SearchSettings(Inputs(str(run_dir), "H200"), st, out, "simulate", str(space), hf_id="org/model"))
    for engine in ("vllm", "sglang"):
        text = (out / f"winner.{engine}.sh").read_text()
        cmds = commands_of(text)
        assert cmds and all(check(engine, argv) is None for argv in cmds)
        assert "org/model" in text and "NOT as priced" in text and "int4 experts" in text
        assert "re-priced without them" in text and "(estimated" in text and "output_tok_s" in text


def test_a_scaled_winner_recipe_carries_the_model_precision_and_topology_as_priced(run_dir, tmp_path):
    from moetune.config import load_recipe
    from moetune.search.study.optuna_study import StudySettings
    from moetune.search.study.run import SearchSettings, run_search
    from moetune.search.study.setup import Inputs

    root = __import__("pathlib").Path(__file__).resolve().parents[2]
    space = tmp_path / "space.yaml"
    space.write_text("ep_size: 8\nreplicas: 1\nquant_low_format: none\noffload_resident_fraction: 1\n")
    out = tmp_path / "scaled"
    st = StudySettings("s", f"sqlite:///{out / 'study.db'}", ("throughput",), "tpe", 2, 0)
    inputs = Inputs(str(run_dir), "8xH200", scale_model=str(root / "recipes/scale/qwen3-30b-a3b.json"),
                    input_len=1024, output_len=64, num_requests=64)
    run_search(SearchSettings(inputs, st, out, "simulate", str(space), hf_id="Qwen/Qwen3-30B-A3B"))
    cfg = load_recipe(out / "winner.yaml")
    assert cfg.model.path == "Qwen/Qwen3-30B-A3B" and cfg.model.dtype == "bf16"
    assert cfg.parallel.ep_size == 8 and cfg.parallel.ranks_per_node == 8
    sglang = (out / "winner.sglang.sh").read_text()
    assert "--attn-dp-size 8" in sglang and "--model-path Qwen/Qwen3-30B-A3B" in sglang
    assert "as priced" in (out / "winner.vllm.sh").read_text()


def speculative_commands(spec: str, target: ServeTarget, grid) -> list[tuple[str, dict, str]]:
    """(engine, flags of each command as the file writes it, the file) for `spec` on `target` over `grid`."""
    t = replace(target, speculative=parse_speculative(spec))
    out = []
    for d in grid:
        for launch in launches(d, t):
            text = launch_text(launch, t, d.label(), {"output_tok_s": 1.0, "estimated": True})
            cmds = commands_of(text)
            assert len(cmds) == len(launch.nodes) >= 1
            for argv in cmds:
                assert check(launch.engine, argv) is None, (d, argv)
                out.append((launch.engine, flags(argv), text))
    return out


@pytest.mark.parametrize("target", [QWEN3, MIXTRAL, DSV3], ids=lambda t: t.model_type)
def test_an_ngram_recipe_launches_with_the_engines_ngram_speculation(target):
    got = speculative_commands("ngram:4", target, GRID[::5])
    assert {e for e, _, _ in got} == {"vllm", "sglang"}
    for engine, f, text in got:
        assert "speculative decoding: priced" in text and "ngram:4" in text
        assert "NOT as priced" in text and "n-gram" in text  # the match rule neither engine has a flag for
        if engine == "vllm":  # moetune's lookup: suffixes of 3, else 2 tokens (engine/speculative/ngram.py)
            assert json.loads(f["--speculative-config"]) == {"method": "ngram", "num_speculative_tokens": 4,
                                                             "prompt_lookup_max": 3, "prompt_lookup_min": 2}
        else:  # SGLang's chain counts its root (the last verified token): 4 drafted = 5; breadth 1 = one chain
            assert (f["--speculative-algorithm"], f["--speculative-num-draft-tokens"]) == ("NGRAM", "5")
            assert f["--speculative-ngram-min-bfs-breadth"] == f["--speculative-ngram-max-bfs-breadth"] == "1"
            assert "--speculative-draft-model-path" not in f


@pytest.mark.parametrize("draft", ["/ckpt/draft-0.5b", "$DRAFT_DIR"])
def test_a_draft_model_recipe_launches_with_the_draft_model_and_its_k(draft):
    got = speculative_commands(f"draft:{draft}:3", QWEN3, GRID[::5]) + speculative_commands(
        f"draft:{draft}:3", DSV3, GRID[1::7])
    sample = "/models/draft" if draft == "$DRAFT_DIR" else draft  # commands_of fills the placeholder in
    for engine, f, text in got:
        assert "speculative decoding: priced" in text
        assert ('DRAFT_DIR="${DRAFT_DIR:?' in text) == (draft == "$DRAFT_DIR")
        if engine == "vllm":
            assert json.loads(f["--speculative-config"]) == {"model": sample, "num_speculative_tokens": 3}
        else:
            assert (f["--speculative-algorithm"], f["--speculative-draft-model-path"]) == ("STANDALONE", sample)
            assert (f["--speculative-num-steps"], f["--speculative-eagle-topk"],
                    f["--speculative-num-draft-tokens"]) == ("3", "1", "4")


def test_an_mtp_recipe_launches_with_the_engines_mtp_speculation():
    got = speculative_commands("mtp:2", DSV3, GRID[::5])
    assert {e for e, _, _ in got} == {"vllm", "sglang"}
    for engine, f, text in got:
        assert "speculative decoding: priced" in text and "mtp:2" in text
        if engine == "vllm":
            assert json.loads(f["--speculative-config"]) == {"method": "mtp", "num_speculative_tokens": 2}
        else:  # EAGLE (= NEXTN) on the target's own MTP layer: no draft model path
            assert (f["--speculative-algorithm"], f["--speculative-num-steps"], f["--speculative-eagle-topk"],
                    f["--speculative-num-draft-tokens"]) == ("EAGLE", "2", "1", "3")
            assert "--speculative-draft-model-path" not in f


def test_the_draft_placeholder_expands_inside_vllms_json_in_a_shell(tmp_path):
    import subprocess

    t = replace(QWEN3, speculative=parse_speculative("draft:$DRAFT_DIR:2"))
    text = launch_text(vllm_launch(Deployment(), t), t, "x", None)
    script = tmp_path / "w.sh"  # the launcher replaced by printing its arguments, one a line
    script.write_text(text.replace("vllm serve ", "printf '%s\\n' "))
    out = subprocess.run(["bash", str(script)], env={"DRAFT_DIR": "/d/x", "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert json.loads(out[out.index("--speculative-config") + 1]) == {"model": "/d/x", "num_speculative_tokens": 2}


def test_a_search_on_a_speculative_recipe_emits_the_speculation_it_priced(run_dir, tmp_path):
    from moetune.config import load_recipe
    from moetune.search.study.optuna_study import StudySettings
    from moetune.search.study.run import SearchSettings, run_search
    from moetune.search.study.setup import Inputs

    recipe = tmp_path / "spec.yaml"
    recipe.write_text("model:\n  path: stdlib-moe\n  device: cpu\nengine:\n  speculative: ngram:4\n")
    space = tmp_path / "space.yaml"
    space.write_text("ep_size: 2\ntp_size: 1\nexpert_tp_size: 1\nreplicas: 1\nquant_low_format: none\n"
                     "offload_resident_fraction: 1\n")
    out = tmp_path / "out"
    st = StudySettings("s", f"sqlite:///{out / 'study.db'}", ("throughput",), "tpe", 2, 0)
    run_search(SearchSettings(Inputs(str(run_dir), "H200", recipe=str(recipe), spec_acceptance=0.6), st, out,
                              "simulate", str(space), hf_id="org/model"))
    assert load_recipe(out / "winner.yaml").engine.speculative == "ngram:4"
    for engine, flag in (("vllm", "--speculative-config"), ("sglang", "--speculative-algorithm")):
        text = (out / f"winner.{engine}.sh").read_text()
        cmds = commands_of(text)
        assert cmds and all(check(engine, argv) is None for argv in cmds)
        assert all(flag in argv for argv in cmds) and "speculative decoding: priced" in text
