"""The bad-input table: every case is one CLI invocation a new user might type, with the exit code
and the words its one stderr line must contain. Run by tests/cli/test_bad_input.py; rendered as
docs/bad-input.md by `python -m tests.cli.bad_input`.

Placeholders in args: {d} the case's own directory (also its cwd and TMPDIR), {ck} a tiny qwen3_moe
checkpoint (7 experts, context 256), {ck6} a tiny olmoe checkpoint (6 experts), {run} a complete
run directory. A `prep(d, src)` function builds the damaged inputs inside {d} first.
"""

from __future__ import annotations

import json
import shlex
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

Prep = Callable[[Path, dict], None]


@dataclass(frozen=True)
class Case:
    id: str
    kind: str
    args: tuple
    code: int
    words: tuple[str, ...]
    prep: Prep | None = None
    signal: str | None = None  # "SIGINT" / "SIGTERM", sent once `wait_for` is seen
    wait_for: str | None = None  # "tmpdir": a run's temporary directory exists; "stdout": first output
    stdout_ok: bool = False  # streamed completion text before an interrupt is allowed
    issue: str = ""  # the failure of issue 14 this case covers (empty: a new case)
    loads_model: bool = False  # a model loads (its kernels compile) before the mistake is found

    @property
    def early(self) -> bool:
        """Whether the case can run while the shared run directory is made (its profile compiles the kernels
        on a fresh clone): it neither reads {run} (args or prep) nor loads a model (an interrupt, `loads_model`)."""
        reads_run = (any(isinstance(a, str) and "{run}" in a for a in self.args)
                     or getattr(self.prep, "reads_run", False))
        return not (reads_run or self.loads_model or self.kind == "interrupt")


# --- preparation helpers ---------------------------------------------------------------------------

def write(rel: str, data: str | bytes) -> Prep:
    def prep(d: Path, src: dict) -> None:
        path = d / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return prep


def mkdir(rel: str) -> Prep:
    return lambda d, src: (d / rel).mkdir(parents=True, exist_ok=True)


def both(*preps: Prep) -> Prep:
    def prep(d: Path, src: dict) -> None:
        for p in preps:
            p(d, src)
    prep.reads_run = any(getattr(p, "reads_run", False) for p in preps)
    return prep


def ck(mutate: Callable[[Path], None] | None = None, source: str = "ck") -> Prep:
    """A private copy of a checkpoint at {d}/ck, then damaged by `mutate(dir)`."""
    def prep(d: Path, src: dict) -> None:
        shutil.copytree(src[source], d / "ck")
        if mutate is not None:
            mutate(d / "ck")
    return prep


def config(**changes) -> Callable[[Path], None]:
    def mutate(path: Path) -> None:
        cfg = json.loads((path / "config.json").read_text())
        cfg.update(changes)
        (path / "config.json").write_text(json.dumps(cfg))
    return mutate


def tensors(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def mutate(path: Path) -> None:
        from safetensors.torch import load_file, save_file

        file = path / "model.safetensors"
        data = load_file(str(file))
        edit(data)
        save_file(data, str(file))
    return mutate


def truncate(fraction: float) -> Callable[[Path], None]:
    def mutate(path: Path) -> None:
        file = path / "model.safetensors"
        raw = file.read_bytes()
        file.write_bytes(raw[: int(len(raw) * fraction)])
    return mutate


def remove(*names: str) -> Callable[[Path], None]:
    def mutate(path: Path) -> None:
        for name in names:
            (path / name).unlink()
    return mutate


def run(mutate: Callable[[Path], None] | None = None) -> Prep:
    """A private copy of the complete run directory at {d}/run, then damaged."""
    def prep(d: Path, src: dict) -> None:
        shutil.copytree(src["run"], d / "run")
        if mutate is not None:
            mutate(d / "run")
    prep.reads_run = True
    return prep


def summary(edit: Callable[[dict], object]) -> Callable[[Path], None]:
    def mutate(path: Path) -> None:
        data = json.loads((path / "summary.json").read_text())
        edit(data)
        (path / "summary.json").write_text(json.dumps(data))
    return mutate


def clobber(name: str, data: bytes) -> Callable[[Path], None]:
    return lambda path: (path / name).write_bytes(data)


def wrong_columns(path: Path) -> None:
    import pandas as pd

    pd.DataFrame({"step": [0], "kind": ["prefill"]}).to_parquet(path / "steps.parquet", index=False)


def _del(key: str) -> Callable[[dict], None]:
    return lambda d: d.pop(key)


def _gate_rows(t: dict) -> None:
    name = "model.layers.1.mlp.gate.weight"
    t[name] = t[name][:-1].contiguous()


def _q_proj(t: dict) -> None:
    name = "model.layers.0.self_attn.q_proj.weight"
    t[name] = t[name][:, :-4].contiguous()


def _int_dtype(t: dict) -> None:
    import torch

    t["model.norm.weight"] = t["model.norm.weight"].to(torch.int32)


def _header_garbage(path: Path) -> None:
    raw = (path / "model.safetensors").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    (path / "model.safetensors").write_bytes(raw[:8] + b"{" + b"\x00" * (n - 1) + raw[8 + n:])


def _index_missing_shard(path: Path) -> None:
    index = json.loads((path / "model.safetensors.index.json").read_text())
    first = sorted(set(index["weight_map"].values()))[0]
    (path / first).unlink()


def _drop_a_scale(t: dict) -> None:
    del t[next(n for n in sorted(t) if n.endswith(".scales"))]


def quantized(mutate: Callable[[Path], None] | None = None) -> Prep:
    """{d}/q: the tiny checkpoint written by moetune quantize (every expert int8), then damaged."""
    def prep(d: Path, src: dict) -> None:
        from moetune.model.quantize import write_quantized
        from moetune.model.validate import read_spec
        from moetune.quant.table import uniform

        spec = read_spec(src["ck"])
        write_quantized(src["ck"], spec, uniform("int8", spec.moe_layers, spec.moe.num_experts), d / "q")
        if mutate is not None:
            mutate(d / "q")
    return prep


G = ("generate", "-p", "def add(a, b):")  # a generate call, model to follow
S = ("search", "--trace", "{run}", "--hardware", "H100", "--out", "{d}/o")  # a search on a cluster
P = ("profile", "--num-requests", "2", "--batch-size", "2", "--input-len", "8", "--output-len", "2",
     "--warmup-steps", "0")
HUGE_CONTEXT = config(max_position_embeddings=10**9)

# --- the table ---------------------------------------------------------------------------------------

CASES: list[Case] = [
    # usage: typer/click found it (exit 2, as click does)
    Case("bare-command", "usage", (), 2, ("no command given", "generate", "--help"), issue="bare moetune"),
    Case("unknown-command", "usage", ("frobnicate",), 2, ("No such command", "frobnicate"), issue="unknown command"),
    Case("unknown-flag", "usage", ("generate", "--bogus"), 2, ("--bogus", "--help"), issue="unknown flag"),
    Case("missing-required-option", "usage", ("generate",), 2, ("--prompt",), issue="missing required option"),
    Case("int-flag-not-a-number", "usage", (*G, "--max-tokens", "many"), 2, ("--max-tokens",),
         issue="flag value of the wrong type"),
    Case("float-flag-not-a-number", "usage", (*G, "--temperature", "hot"), 2, ("--temperature",)),
    Case("flag-without-value", "usage", (*G, "--max-tokens"), 2, ("--max-tokens", "requires an argument")),
    Case("profile-int-flag", "usage", ("profile", "--num-requests", "lots"), 2, ("--num-requests",)),
    Case("bench-runs-below-min", "usage", ("bench", "--runs", "1"), 2, ("--runs",)),
    Case("bench-prefill-zero", "usage", ("bench", "--prefill-len", "0"), 2, ("--prefill-len",)),
    Case("report-missing-run-dir", "usage", ("report",), 2, ("Missing argument",)),
    Case("report-extra-argument", "usage", ("report", "a", "b"), 2, ("unexpected extra argument",)),
    Case("flag-of-another-command", "usage", (*G, "--trace"), 2, ("--trace",)),
    Case("tune-kernels-batch-not-int", "usage", ("tune-kernels", "--batch-size", "x"), 2, ("--batch-size",)),
    # values (exit 1, before any model is loaded)
    Case("temperature-nan", "value", (*G, "--temperature", "nan"), 1, ("--temperature", "finite"),
         issue="--temperature nan"),
    Case("temperature-inf", "value", (*G, "--temperature", "inf"), 1, ("--temperature", "finite")),
    Case("temperature-negative", "value", (*G, "--temperature", "-1"), 1, ("--temperature", ">= 0")),
    Case("top-p-nan", "value", (*G, "--top-p", "nan"), 1, ("--top-p", "finite")),
    Case("top-p-above-one", "value", (*G, "--top-p", "1.5"), 1, ("--top-p", "<= 1")),
    Case("top-p-zero", "value", (*G, "--top-p", "0"), 1, ("--top-p", "> 0")),
    Case("top-k-negative", "value", (*G, "--top-k", "-1"), 1, ("--top-k",)),
    Case("max-tokens-zero", "value", (*G, "--max-tokens", "0"), 1, ("--max-tokens", ">= 1")),
    Case("generate-max-tokens-over-context", "value", (*G, "-m", "{ck}", "--max-tokens", "99999"), 1,
         ("--max-tokens 99999", "context of 256", "at most 255")),
    Case("seed-negative", "value", (*G, "--seed", "-1"), 1, ("--seed",)),
    Case("speculative-bad-form", "value", (*G, "--speculative", "ngram:0"), 1,
         ("engine.speculative", "ngram:0", "ngram:K")),
    Case("speculative-auto-without-k", "value", (*G, "--speculative", "ngram:auto"), 1,
         ("engine.speculative", "ngram:auto", "':auto' after K")),
    Case("speculative-mtp-missing", "value", (*G, "-m", "{ck}", "--speculative", "mtp:2"), 1,
         ("num_nextn_predict_layers", "no MTP layer", "ngram:K")),
    Case("speculative-draft-missing", "value", (*G, "--speculative", "draft:{d}/nope:2"), 1,
         ("draft model", "nope", "neither a directory nor a bundled model")),
    Case("speculative-draft-other-vocabulary", "value", (*G, "--speculative", "draft:{ck}:2"), 1,
         ("draft model's vocabulary has 320", "8,192", "share the target's tokenizer")),
    Case("speculative-auto-with-tp", "value", (*G, "--speculative", "ngram:2:auto", "--tp-size", "2"), 1,
         ("engine.speculative", "adaptive k", "tp_size=2", "fixed K")),
    Case("capacity-factor-nan", "value", ("profile", "--capacity-factor", "nan"), 1, ("--capacity-factor", "finite")),
    Case("capacity-factor-zero", "value", ("profile", "--capacity-factor", "0"), 1, ("--capacity-factor",)),
    Case("num-requests-zero", "value", ("profile", "--num-requests", "0"), 1, ("--num-requests",)),
    Case("batch-size-zero", "value", ("profile", "--batch-size", "0"), 1, ("--batch-size",)),
    Case("warmup-negative", "value", ("profile", "--warmup-steps", "-1"), 1, ("--warmup-steps",)),
    Case("ep-size-zero", "value", ("profile", "-m", "{ck}", "--ep-size", "0"), 1, ("--ep-size",)),
    Case("ep-size-not-divisor", "value", ("profile", "-m", "{ck6}", "--ep-size", "4"), 1, ("--ep-size 4", "6 experts")),
    Case("tp-size-not-divisor", "value", (*G, "-m", "{ck}", "--tp-size", "3"), 1,
         ("--tp-size 3", "attention heads (4)")),
    Case("expert-tp-size-not-divisor", "value", (*G, "-m", "{ck}", "--expert-tp-size", "5"), 1,
         ("--expert-tp-size 5", "expert intermediate size (24)")),
    Case("tp-sizes-not-one-mesh", "value", (*G, "-m", "{ck}", "--tp-size", "2", "--expert-tp-size", "4"), 1,
         ("tp_size=2", "expert_tp_size=4", "1 or the group size 4")),
    Case("tp-profile-prompt-too-long", "value", ("profile", "-m", "{ck}", "--tp-size", "2", "--num-requests", "1",
                                                 "--prompts", "{d}/p.txt", "--output-len", "4"), 1,
         ("exceeds the model's context",), prep=write("p.txt", "x = 1; " * 200 + "\n")),
    Case("tp-shard-missing", "checkpoint", (*G, "-m", "{d}/ck", "--expert-tp-size", "2"), 1, ("shard", "missing"),
         prep=ck(_index_missing_shard, source="sharded")),
    Case("bench-unknown-reference", "value", ("bench", "--against", "vllm"), 1, ("vllm", "transformers")),
    Case("dtype-unknown", "value", (*G, "--dtype", "fp8"), 1, ("model.dtype",)),
    Case("kernel-backend-unknown", "value", (*G, "--kernel-backend", "cuda"), 1, ("model.kernel_backend",)),
    # devices
    Case("device-bogus", "device", (*G, "--device", "bogus"), 1, ("bogus", "cpu"), issue="--device bogus"),
    Case("device-meta", "device", (*G, "--device", "meta"), 1, ("meta",), issue="--device meta"),
    Case("device-cuda-7", "device", (*G, "--device", "cuda:7"), 1, ("cuda:7",)),
    Case("recipe-device-bogus", "device", (*G, "-r", "{d}/r.yaml"), 1, ("bogus",),
         prep=write("r.yaml", "model:\n  device: bogus\n")),
    # prompt text and prompts files
    Case("prompt-invalid-utf8", "prompt", ("generate", "-p", b"caf\xe9", "-m", "{ck}"), 1, ("--prompt", "UTF-8"),
         issue="prompt not valid UTF-8"),
    Case("prompt-lone-surrogate", "prompt", ("generate", "-p", b"x\xed\xa0\x80", "-m", "{ck}"), 1,
         ("--prompt", "UTF-8"), issue="prompt with a lone surrogate"),
    Case("stop-invalid-utf8", "prompt", (*G, "--stop", b"\xff", "-m", "{ck}"), 1, ("--stop", "UTF-8")),
    Case("prompt-longer-than-context", "prompt", ("generate", "-m", "{ck}", "-p", "for i in range(10):\n" * 200),
         1, ("context",)),
    Case("prompts-file-missing", "prompts", ("profile", "--prompts", "{d}/nope.jsonl"), 1, ("nope.jsonl",)),
    Case("prompts-file-is-dir", "prompts", ("profile", "--prompts", "{d}"), 1, ("prompts file",)),
    Case("prompts-file-empty", "prompts", ("profile", "--prompts", "{d}/p.txt"), 1, ("no prompts",),
         prep=write("p.txt", "")),
    Case("prompts-file-blank-lines", "prompts", ("profile", "--prompts", "{d}/p.txt"), 1, ("no prompts",),
         prep=write("p.txt", "\n  \n\t\n")),
    Case("prompts-jsonl-not-json", "prompts", ("profile", "--prompts", "{d}/p.jsonl"), 1, ("line 2", "not JSON"),
         prep=write("p.jsonl", '{"prompt": "a"}\n{oops\n')),
    Case("prompts-jsonl-no-field", "prompts", ("profile", "--prompts", "{d}/p.jsonl"), 1, ("line 1", "'prompt'"),
         prep=write("p.jsonl", '{"text": "a"}\n')),
    Case("prompts-jsonl-not-string", "prompts", ("profile", "--prompts", "{d}/p.jsonl"), 1, ("'prompt'",),
         prep=write("p.jsonl", '{"prompt": 42}\n')),
    Case("prompts-jsonl-array", "prompts", ("profile", "--prompts", "{d}/p.jsonl"), 1, ("'prompt'",),
         prep=write("p.jsonl", '[1, 2]\n')),
    Case("prompts-jsonl-lone-surrogate", "prompts", ("profile", "--prompts", "{d}/p.jsonl"), 1,
         ("line 1", "surrogate"), prep=write("p.jsonl", '{"prompt": "a\\ud800b"}\n'), issue="prompt with a lone surrogate"),
    Case("prompts-file-invalid-utf8", "prompts", ("profile", "--prompts", "{d}/p.txt"), 1, ("p.txt", "utf-8"),
         prep=write("p.txt", b"ok\n\xff\xfe\n")),
    # recipes
    Case("recipe-missing", "recipe", (*G, "-r", "{d}/none.yaml"), 1, ("none.yaml", "does not exist")),
    Case("recipe-is-dir", "recipe", (*G, "-r", "{d}"), 1, ("is a directory",)),
    Case("recipe-not-yaml", "recipe", (*G, "-r", "{d}/r.yaml"), 1, ("r.yaml", "not valid YAML"),
         prep=write("r.yaml", "model: [unclosed\n")),
    Case("recipe-not-utf8", "recipe", (*G, "-r", "{d}/r.yaml"), 1, ("r.yaml", "UTF-8"),
         prep=write("r.yaml", b"model:\n  path: \xff\n")),
    Case("recipe-a-list", "recipe", (*G, "-r", "{d}/r.yaml"), 1, ("mapping",), prep=write("r.yaml", "- a\n- b\n")),
    Case("recipe-unknown-key", "recipe", (*G, "-r", "{d}/r.yaml"), 1, ("model.dtpye",),
         prep=write("r.yaml", "model:\n  dtpye: fp32\n")),
    Case("recipe-wrong-type", "recipe", (*G, "-r", "{d}/r.yaml"), 1, ("parallel.ep_size",),
         prep=write("r.yaml", "parallel:\n  ep_size: two\n")),
    Case("recipe-impossible-value", "recipe", (*G, "-r", "{d}/r.yaml"), 1, ("parallel.ep_size",),
         prep=write("r.yaml", "parallel:\n  ep_size: 0\n")),
    Case("recipe-ranks-do-not-tile", "recipe", (*G, "-r", "{d}/r.yaml"), 1, ("do not tile",),
         prep=write("r.yaml", "parallel:\n  ep_size: 3\n  ranks_per_node: 2\n")),
    Case("recipe-port-out-of-range", "recipe", (*G, "-r", "{d}/r.yaml"), 1, ("serve.port",),
         prep=write("r.yaml", "serve:\n  port: 70000\n")),
    # checkpoints
    Case("model-dir-missing", "checkpoint", (*G, "-m", "{d}/nope"), 1, ("nope",)),
    Case("model-dir-is-file", "checkpoint", (*G, "-m", "{d}/f"), 1, ("neither a directory",), prep=write("f", "x")),
    Case("no-config-json", "checkpoint", (*G, "-m", "{d}/ck"), 1, ("config.json",), prep=ck(remove("config.json"))),
    Case("config-not-json", "checkpoint", (*G, "-m", "{d}/ck"), 1, ("config.json", "not valid JSON"),
         prep=ck(lambda p: (p / "config.json").write_text("{oops"))),
    Case("config-not-utf8", "checkpoint", (*G, "-m", "{d}/ck"), 1, ("config.json",),
         prep=ck(lambda p: (p / "config.json").write_bytes(b'{"model_type": "\xff"}'))),
    Case("config-a-list", "checkpoint", (*G, "-m", "{d}/ck"), 1, ("config.json", "JSON object"),
         prep=ck(lambda p: (p / "config.json").write_text("[1]"))),
    Case("config-unsupported-type", "checkpoint", (*G, "-m", "{d}/ck"), 1, ("llama", "qwen3_moe"),
         prep=ck(config(model_type="llama"))),
    Case("config-size-a-string", "checkpoint", (*G, "-m", "{d}/ck"), 1, ("hidden_size", '"big"'),
         prep=ck(config(hidden_size="big"))),
    Case("config-zero-heads", "checkpoint", (*G, "-m", "{d}/ck"), 1, ("num_attention_heads",),
         prep=ck(config(num_attention_heads=0))),
    Case("config-negative-eps", "checkpoint", (*G, "-m", "{d}/ck"), 1, ("rms_norm_eps",),
         prep=ck(config(rms_norm_eps=-1))),
    Case("config-unsupported-activation", "checkpoint", (*G, "-m", "{d}/ck"), 1, ("hidden_act", "gelu"),
         prep=ck(config(hidden_act="gelu"))),
    Case("config-top-k-above-experts", "checkpoint", (*G, "-m", "{d}/ck"), 1, ("num_experts_per_tok",),
         prep=ck(config(num_experts_per_tok=9))),
    Case("config-eos-outside-vocab", "checkpoint", (*G, "-m", "{d}/ck"), 1, ("eos_token_id", "99999"),
         prep=ck(config(eos_token_id=99999))),
    Case("no-weights", "checkpoint", (*G, "-m", "{d}/ck"), 1, ("no *.safetensors",),
         prep=ck(remove("model.safetensors"))),
    Case("weights-truncated", "checkpoint", (*G, "-m", "{d}/ck"), 1, ("model.safetensors", "truncated"),
         prep=ck(truncate(0.5)), issue="truncated safetensors file"),
    Case("weights-empty-file", "checkpoint", (*G, "-m", "{d}/ck"), 1, ("model.safetensors", "truncated"),
         prep=ck(truncate(0.0))),
    Case("weights-corrupt-header", "checkpoint", (*G, "-m", "{d}/ck"), 1, ("model.safetensors", "corrupt"),
         prep=ck(_header_garbage), issue="corrupt safetensors file"),
    Case("tensor-missing", "checkpoint", (*G, "-m", "{d}/ck"), 1, ("model.layers.1.mlp.experts.3.up_proj.weight",),
         prep=ck(tensors(_del("model.layers.1.mlp.experts.3.up_proj.weight")))),
    Case("router-gate-fewer-rows", "checkpoint", (*G, "-m", "{d}/ck"), 1,
         ("model.layers.1.mlp.gate.weight", "[6, 48]", "[7, 48]"), prep=ck(tensors(_gate_rows)),
         issue="router gate with fewer rows loads silently"),
    Case("attention-shape-mismatch", "checkpoint", (*G, "-m", "{d}/ck"), 1,
         ("model.layers.0.self_attn.q_proj.weight", "[64, 44]", "[64, 48]"), prep=ck(tensors(_q_proj)),
         issue="tensor shape disagrees with config.json"),
    Case("tensor-integer-dtype", "checkpoint", (*G, "-m", "{d}/ck"), 1, ("model.norm.weight", "I32"),
         prep=ck(tensors(_int_dtype))),
    Case("shard-missing", "checkpoint", (*G, "-m", "{d}/ck"), 1, ("shard", "missing"),
         prep=ck(_index_missing_shard, source="sharded")),
    Case("shard-index-corrupt", "checkpoint", (*G, "-m", "{d}/ck"), 1, ("model.safetensors.index.json", "corrupt"),
         prep=ck(lambda p: (p / "model.safetensors.index.json").write_text("{"), source="sharded")),
    Case("no-tokenizer-files", "checkpoint", (*G, "-m", "{d}/ck"), 1, ("no tokenizer files", "tokenizer.json"),
         prep=ck(remove("tokenizer.json", "tokenizer_config.json")), issue="no tokenizer files"),
    Case("tokenizer-corrupt", "checkpoint", (*G, "-m", "{d}/ck"), 1, ("tokenizer.json", "corrupt"),
         prep=ck(lambda p: (p / "tokenizer.json").write_text('{"version": '))),
    Case("bench-damaged-checkpoint", "checkpoint", ("bench", "-m", "{d}/ck"), 1, ("model.layers.1.mlp.gate.weight",),
         prep=ck(tensors(_gate_rows))),
    Case("ep-size-recipe-not-divisor", "checkpoint", (*G, "-m", "{ck}", "-r", "{d}/r.yaml"), 1,
         ("--ep-size 2", "7 experts"), prep=write("r.yaml", "parallel:\n  ep_size: 2\n")),
    # output paths (checked before the model loads)
    Case("out-below-a-file", "output", (*P, "-m", "{ck}", "--out", "{d}/f/run"), 1, ("--out", "is a file"),
         prep=write("f", "x"), issue="--out below a regular file"),
    Case("out-is-a-file", "output", (*P, "-m", "{ck}", "--out", "{d}/f"), 1, ("--out", "existing file"),
         prep=write("f", "x")),
    Case("out-uncreatable", "output", (*P, "-m", "{ck}", "--out", "/proc/moetune-run"), 1, ("--out", "/proc"),
         issue="--out in an unwritable place"),
    Case("out-not-empty", "output", (*P, "-m", "{ck}", "--out", "{d}/taken"), 1, ("already exists",),
         prep=write("taken/summary.json", "{}")),
    Case("report-out-dir-missing", "output", ("report", "{run}", "--out", "{d}/no/such/r.html"), 1,
         ("--out", "does not exist")),
    Case("report-out-is-dir", "output", ("report", "{run}", "--out", "{d}"), 1, ("--out", "is a directory")),
    Case("report-out-below-file", "output", ("report", "{run}", "--out", "{d}/f/r.html"), 1, ("--out", "is a file"),
         prep=write("f", "x")),
    Case("report-out-uncreatable", "output", ("report", "{run}", "--out", "/proc/moetune-report.html"), 1,
         ("--out", "/proc")),
    Case("tune-kernels-out-below-file", "output", ("tune-kernels", "--out", "{d}/f/cfg"), 1, ("--out", "is a file"),
         prep=write("f", "x")),
    # run directories
    Case("run-dir-missing", "rundir", ("report", "{d}/nope"), 1, ("nope", "does not exist")),
    Case("run-dir-is-file", "rundir", ("report", "{d}/f"), 1, ("is a file",), prep=write("f", "x")),
    Case("run-dir-empty", "rundir", ("report", "{d}/e"), 1, ("not a complete run directory", "summary.json"),
         prep=mkdir("e")),
    Case("run-summary-corrupt", "rundir", ("report", "{d}/run"), 1, ("summary.json", "corrupt"),
         prep=run(clobber("summary.json", b'{"kinds": ')), issue="corrupt summary.json"),
    Case("run-summary-a-list", "rundir", ("report", "{d}/run"), 1, ("summary.json", "corrupt"),
         prep=run(clobber("summary.json", b"[]"))),
    Case("run-summary-no-schema-version", "rundir", ("report", "{d}/run"), 1, ("summary.json", "schema_version"),
         prep=run(summary(_del("schema_version")))),
    Case("run-summary-other-schema", "rundir", ("report", "{d}/run"), 1, ("summary.json", "schema_version 99"),
         prep=run(summary(lambda s: s.update(schema_version=99)))),
    Case("run-summary-missing-section", "rundir", ("report", "{d}/run"), 1, ("summary.json", "'kinds'"),
         prep=run(summary(_del("kinds")))),
    Case("run-parquet-corrupt", "rundir", ("report", "{d}/run"), 1, ("steps.parquet", "corrupt"),
         prep=run(clobber("steps.parquet", b"PAR1 not really")), issue="corrupt Parquet file"),
    Case("run-parquet-wrong-columns", "rundir", ("report", "{d}/run"), 1, ("steps.parquet", "column"),
         prep=run(wrong_columns)),
    Case("run-parquet-missing", "rundir", ("report", "{d}/run"), 1, ("phases.parquet", "missing"),
         prep=run(remove("phases.parquet"))),
    Case("run-trace-corrupt", "rundir", ("report", "{d}/run"), 1, ("routing.npz", "corrupt"),
         prep=run(clobber("routing.npz", b"PK\x03\x04 broken"))),
    Case("run-env-corrupt", "rundir", ("report", "{d}/run"), 1, ("env.json", "corrupt"),
         prep=run(clobber("env.json", b"\xff\xfe"))),
    Case("report-format-unknown", "rundir", ("report", "{run}", "--format", "pdf"), 1, ("--format", "pdf")),
    # sizes: refused with the numbers, before loading
    Case("bench-prefill-over-context", "size", ("bench", "--prefill-len", "100000"), 1,
         ("--prefill-len 100000", "2048"), issue="bench --prefill-len 100000 runs 88 s then fails"),
    Case("bench-decode-over-context", "size", ("bench", "-m", "{ck}", "--prefill-len", "16", "--decode-steps", "1000"),
         1, ("--decode-steps 1000", "256")),
    Case("bench-over-memory", "size", ("bench", "-m", "{d}/ck", "--prefill-len", "10000000"), 1,
         ("--prefill-len 10000000", "GB", "available"), prep=ck(HUGE_CONTEXT)),
    Case("profile-input-over-context", "size", (*P[:5], "--input-len", "100000", "-m", "{ck}"), 1,
         ("--input-len 100000", "256")),
    Case("profile-over-memory", "size", ("profile", "-m", "{d}/ck", "--num-requests", "100000", "--batch-size",
                                         "100000", "--input-len", "1000000", "--output-len", "1"), 1,
         ("batch 100000", "GB", "KV cache"), prep=ck(HUGE_CONTEXT), issue="profile --batch-size 100000 KV sizing"),
    Case("profile-trace-over-memory", "size", ("profile", "-m", "{ck}", "--num-requests", "1000000000000",
                                               "--input-len", "8", "--output-len", "2"), 1,
         ("--num-requests 1000000000000", "routing trace", "GB")),
    # per-expert precision and offloading ({ck}: D = 48, I = 24, top-k 3)
    Case("quantize-unknown-format", "quant", ("quantize", "-m", "{ck}", "--policy", "int9", "--out", "{d}/q"), 1,
         ("unknown expert format 'int9'", "int4-g64")),
    Case("quantize-group-not-dividing", "quant", ("quantize", "-m", "{ck}", "--policy", "int4-g32", "--out", "{d}/q"),
         1, ("group size 32 does not divide", "use int8")),
    Case("quantize-hot-without-loads", "quant", ("quantize", "-m", "{ck}", "--policy", "hot=0.25", "--out", "{d}/q"),
         1, ("--loads",)),
    Case("quantize-nothing-to-pack", "quant", ("quantize", "-m", "{ck}", "--out", "{d}/q"), 1,
         ("--policy or --table", "--dense")),
    Case("quantize-dense-unknown-format", "quant", ("quantize", "-m", "{ck}", "--dense", "fp8", "--out", "{d}/q"), 1,
         ("dense format 'fp8'", "int8", "int4-g64")),
    Case("quantize-dense-group-not-dividing", "quant",
         ("quantize", "-m", "{ck}", "--dense", "int4-g32", "--out", "{d}/q"), 1,
         ("group size 32 does not divide", "in-features of", "use int8")),
    Case("recipe-quant-dense-unknown-format", "quant", (*G, "-m", "{ck}", "-r", "{d}/r.yaml"), 1,
         ("quant.dense", "dense format 'bf16'"), prep=write("r.yaml", "quant:\n  dense: bf16\n")),
    Case("recipe-quant-dense-with-tp", "quant", (*G, "-m", "{ck}", "--tp-size", "2", "-r", "{d}/r.yaml"), 1,
         ("quant.dense int8", "tensor-parallel group of 2", "tp_size and expert_tp_size 1"),
         prep=write("r.yaml", "quant:\n  dense: int8\n")),
    Case("recipe-quant-unknown-format", "quant", (*G, "-m", "{ck}", "-r", "{d}/r.yaml"), 1,
         ("unknown expert format 'fp4'",), prep=write("r.yaml", "quant:\n  experts: fp4\n")),
    Case("quantized-missing-scales", "quant", (*G, "-m", "{d}/q"), 1, ("lacks the scales", "moetune quantize"),
         prep=quantized(tensors(_drop_a_scale))),
    Case("offload-capacity-below-top-k", "offload", (*G, "-m", "{ck}", "-r", "{d}/r.yaml"), 1,
         ("resident capacity 2", "below top-k 3"), prep=write("r.yaml", "offload:\n  resident_experts: 2\n")),
    Case("offload-dir-unusable", "offload", (*G, "-m", "{ck}", "-r", "{d}/r.yaml"), 1,
         ("offload directory 'blocker'", "cannot be used"),
         prep=both(write("blocker", "x"), write("r.yaml", "offload:\n  resident_experts: 3\n  tier: disk\n"
                                                          "  dir: blocker\n"))),
    Case("offload-disk-after-dir-unusable", "offload", (*G, "-m", "{ck}", "-r", "{d}/r.yaml"), 1,
         ("offload directory 'blocker'", "cannot be used"),
         prep=both(write("blocker", "x"), write("r.yaml", "offload:\n  resident_experts: 3\n  disk_after: 2\n"
                                                          "  dir: blocker\n"))),
    Case("offload-disk-after-with-disk-tier", "offload", (*G, "-m", "{ck}", "-r", "{d}/r.yaml"), 1,
         ("offload.disk_after", "tier host with disk_after"),
         prep=write("r.yaml", "offload:\n  resident_experts: 3\n  tier: disk\n  disk_after: 2\n")),
    Case("offload-with-expert-parallelism", "offload", (*G, "-m", "{ck}", "-r", "{d}/r.yaml"), 1,
         ("offload with parallel.ep_size=7", "not supported yet", "ep_size 1"),
         prep=write("r.yaml", "parallel:\n  ep_size: 7\noffload:\n  resident_experts: 3\n")),
    Case("offload-formats-above-capacity", "offload", (*G, "-m", "{ck}", "-r", "{d}/r.yaml"), 1,
         ("capacity 3", "below the 4 expert formats"),
         prep=both(write("t.json", '{"default": ["int8", "fp32", "bf16", "fp16", "int8", "int8", "fp32"]}'),
                   write("r.yaml", "quant:\n  table: t.json\noffload:\n  resident_experts: 3\n"
                                   "model:\n  kernel_backend: torch\n"))),
    # search and simulate
    Case("search-unknown-sampler", "search", (*S, "--sampler", "cmaes"), 1, ("--sampler 'cmaes'",)),
    Case("search-unknown-knob", "search", (*S, "--space", "{d}/space.yaml"), 1, ("unknown knob 'warp'",),
         prep=write("space.yaml", "warp: 3\n")),
    Case("search-knob-value-outside", "search", (*S, "--space", "{d}/space.yaml"), 1,
         ("quant_low_format", "not one of"), prep=write("space.yaml", "quant_low_format: int3\n")),
    Case("search-storage-unreachable", "search", (*S, "--storage", "nosuchdb://x"), 1, ("--storage",)),
    Case("search-max-kl-negative", "search", (*S, "--max-kl", "-0.01"), 1, ("--max-kl -0.01 must be >= 0",)),
    Case("search-max-dropped-fraction-over-one", "search", (*S, "--max-dropped-fraction", "1.5"), 1,
         ("--max-dropped-fraction 1.5 must be <= 1",)),
    Case("search-measure-off-machine", "search", (*S, "--evaluator", "measure"), 1,
         ("--hardware this-machine",)),
    Case("simulate-unknown-hardware", "search", ("simulate", "--trace", "{run}", "--hardware", "Z9000"), 1,
         ("Z9000",)),
    Case("simulate-unknown-calibration", "search", ("simulate", "--trace", "{run}", "--calibrate-on", "vibes"), 1,
         ("--calibrate-on 'vibes'", "microbenchmarks, trace")),
    Case("serve-recipe-tp-size-not-divisor", "search", ("serve", "-r", "{d}/r.yaml", "--port", "0"), 1,
         ("--tp-size 3", "attention heads (4)"), prep=write("r.yaml", "parallel:\n  tp_size: 3\n")),
    Case("simulate-concurrency-and-rate", "search", ("simulate", "--trace", "{run}", "--hardware", "H100",
                                                     "--concurrency", "4", "--request-rate", "2"), 1,
         ("--concurrency and --request-rate", "give one")),
    Case("simulate-rate-not-positive", "search", ("simulate", "--trace", "{run}", "--hardware", "H100",
                                                  "--request-rate", "0"), 1, ("--request-rate must be above 0",)),
    Case("search-goodput-without-slos", "search", (*S, "--objective", "goodput", "--concurrency", "4"), 1,
         ("--slo-ttft-ms", "--slo-tpot-ms")),
    Case("search-measure-steady", "search", ("search", "--trace", "{run}", "--evaluator", "measure", "--concurrency",
                                             "2", "--out", "{d}/o"), 1, ("runs a burst",)),
    Case("search-trace-not-a-run", "search", ("search", "--trace", "{d}", "--hardware", "H100", "--out", "{d}/o"),
         1, ("run directory",)),
    Case("serve-ep-size-not-dividing", "search", ("serve", "-m", "{ck}", "--ep-size", "2", "--port", "0"), 1,
         ("--ep-size 2 does not divide the model's 7 experts",)),
    Case("serve-ep-expert-share", "search", ("serve", "-m", "{ck}", "-r", "{d}/r.yaml", "--port", "0"), 1,
         ("expert_share", "parallel.ep_size=7"),
         prep=write("r.yaml", "parallel:\n  ep_size: 7\nserve:\n  tenants:\n    a:\n      expert_share: 0.5\n")),
    Case("serve-scheduling-unknown", "search", ("serve", "-m", "{ck}", "--scheduling", "random", "--port", "0"), 1,
         ("engine.scheduling", "'fcfs' or 'affinity'")),
    Case("serve-affinity-max-wait-zero", "search", ("serve", "-m", "{ck}", "--scheduling", "affinity",
                                                    "--affinity-max-wait", "0", "--port", "0"), 1,
         ("engine.affinity_max_wait", "greater than or equal to 1")),
    # interrupts: one line, 130 / 143, nothing left behind
    Case("profile-ctrl-c", "interrupt", ("profile", "-m", "{ck}", "--num-requests", "4000", "--batch-size", "2",
                                         "--input-len", "8", "--output-len", "8", "--out", "{d}/run"), 130,
         ("interrupted",), signal="SIGINT", wait_for="tmpdir", issue="Ctrl-C in profile exits 0"),
    Case("profile-sigterm", "interrupt", ("profile", "-m", "{ck}", "--num-requests", "4000", "--batch-size", "2",
                                          "--input-len", "8", "--output-len", "8", "--out", "{d}/run"), 143,
         ("terminated",), signal="SIGTERM", wait_for="tmpdir"),
    Case("generate-ctrl-c", "interrupt", ("generate", "-p", "def ", "--max-tokens", "2000", "--ignore-eos"), 130,
         ("interrupted",), signal="SIGINT", wait_for="stdout", stdout_ok=True, issue="Ctrl-C in generate exits 0"),
    Case("generate-sigterm", "interrupt", ("generate", "-p", "def ", "--max-tokens", "2000", "--ignore-eos"), 143,
         ("terminated",), signal="SIGTERM", wait_for="stdout", stdout_ok=True),
]


def markdown(results: dict[str, tuple[int, str]] | None = None) -> str:
    """The table as markdown; `results` (id → exit code, stderr line) fills in the real messages."""
    lines = ["| # | kind | case | example | exit | message |", "|---|---|---|---|---|---|"]
    for n, case in enumerate(CASES, 1):
        example = shlex.join(a.decode("utf-8", "backslashreplace") if isinstance(a, bytes) else a
                             for a in ("moetune",) + case.args)
        example = example.replace("\n", "\\n")
        if len(example) > 90:
            example = example[:87] + "..."
        code, message = results.get(case.id, (case.code, "")) if results else (case.code, "")
        message = message or "…" + " … ".join(case.words) + "…"
        cell = lambda s: s.replace("|", "\\|")  # noqa: E731
        lines.append(f"| {n} | {case.kind} | {case.id} | `{cell(example)}` | {code} | {cell(message)} |")
    return "\n".join(lines) + "\n"
