"""Quality of a trial's low-bit expert mix: the KL / top-1 agreement `moetune eval` measures for that
(low format, hot fraction) on the trace's own model, measured once per point and cached beside the study.

- Measured by `moetune.bench.evaluate.evaluate` (the function behind `moetune eval`) at a small fixed
  size (`QualitySize`: 4 held-out prompts of 32 tokens, 4 greedy tokens, one perplexity window of 64;
  the prompts file's last 4, not the first ones a profile runs, whose routing ranked the hot experts):
  the mix is the trial's `quant` section (`space.quant_section`: the hot experts ranked by the trace's
  loads), the reference the same checkpoint without it (fp32, or the recipe's bf16 / fp16).
- The model is the trace's own (the run directory's checkpoint). A scaled search (--scale-model)
  prices a target without weights: the trace's model stands in, and the tables say so (`stand_in`).
- No low format: KL 0, top-1 1, nothing run.
- The cache (`OUT/quality.json`) is keyed by the checkpoint's identity (its resolved directory and
  each file's name, size and mtime), the format, the hot fraction, the eval size and, with a hot
  fraction, the trace's run directory (its loads chose the hot experts); a resumed study
  or a second trial at the same point reads it. Workers share it: a write merges under a file lock.
- The kernel backend is the recipe's when it computes the format, else torch's dequantise-then-matmul
  twin (CPU has no fp8 kernel); the entry records which.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from moetune.config import RunConfig, parse_config
from moetune.search.cost.deployment import Deployment
from moetune.search.cost.metrics import Metrics
from moetune.search.study.space import QUANT_FORMATS, Space, to_config

QUALITY_DETAIL = ("kl", "top1_agreement")  # the figures a trial's metrics carry (detail), trials.csv columns


@dataclass(frozen=True)
class QualitySize:
    """The eval size of every point (part of the cache key): seconds a point on the bundled model."""

    num_prompts: int = 4
    prompt_tokens: int = 32
    greedy_tokens: int = 4
    window: int = 64
    max_windows: int = 1

    def settings(self):
        from moetune.bench.quality import EvalSettings

        return EvalSettings(window=self.window, max_windows=self.max_windows, num_prompts=self.num_prompts,
                            prompt_tokens=self.prompt_tokens, greedy_tokens=self.greedy_tokens)


def has_low_bit(space: Space) -> bool:
    return any(v != "none" for k in space.knobs if k.name == "quant_low_format" for v in k.values)


def checkpoint_identity(model_dir: Path) -> dict:
    """The checkpoint as the cache knows it: its resolved directory and each file's name, size, mtime."""
    files = sorted(p for p in Path(model_dir).iterdir() if p.is_file())
    return {"dir": str(Path(model_dir).resolve()),
            "files": [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files]}


@dataclass
class QualityLookup:
    model: RunConfig  # the trace's model (its `model` section; no quant, no offload)
    loads: str  # the trace's run directory: its expert loads rank the hot experts
    path: Path  # OUT/quality.json
    backend: str  # the recipe's kernel backend here (cpu | triton | torch)
    size: QualitySize = QualitySize()
    stand_in: str | None = None  # the scaled target the trace's model stands in for (None: not scaled)
    measured: int = 0  # points this process measured (not read from the cache)
    _identity: dict | None = field(default=None, repr=False)

    def identity(self) -> dict:
        if self._identity is None:
            from moetune.model.registry import resolve_model

            self._identity = checkpoint_identity(resolve_model(self.model.model.path))
        return self._identity

    def key(self, low: str, hot: float) -> str:
        return json.dumps({"checkpoint": self.identity(), "format": low, "hot_fraction": float(hot),
                           "size": asdict(self.size), "loads": self.loads if hot else None}, sort_keys=True)

    def quality(self, d: Deployment) -> dict:
        """{kl, top1_agreement} of the deployment's expert mix (no low format: 0 and 1, nothing run)."""
        if d.quant_low_format == "none":
            return {"kl": 0.0, "top1_agreement": 1.0}
        key = self.key(d.quant_low_format, d.quant_hot_fraction)
        entry = read_cache(self.path).get(key)
        if entry is None:
            entry = self.measure(d.quant_low_format, d.quant_hot_fraction)
            store(self.path, key, entry)
        return {"kl": entry["kl"], "top1_agreement": entry["top1_agreement"]}

    def measure(self, low: str, hot: float) -> dict:
        from moetune.bench import evaluate as ev
        from moetune.engine.target import resolve_target

        cfg = self.config(low, hot)
        t0 = time.perf_counter()
        target = resolve_target(cfg)
        texts, body = eval_texts()
        texts = texts[-self.size.num_prompts:]  # the file's last prompts: a profile runs its first ones, and the
        # hot experts ranked on a text's own routing would flatter the mix on that text
        result = ev.evaluate(target, ev.reference_target(target, None), body, texts, self.size.settings())
        self.measured += 1
        a = result["agreement"]
        return {"format": low, "hot_fraction": float(hot), "kl": a["kl"], "top1_agreement": a["top1_agreement"],
                "greedy_match": a["greedy_match"], "positions": a["positions"], "prompts": a["prompts"],
                "perplexity": result["perplexity"]["ppl"], "reference_perplexity": result["reference_perplexity"]["ppl"],
                "model": result["model"], "kernel_backend": cfg.model.kernel_backend,
                "seconds": round(time.perf_counter() - t0, 3)}

    def config(self, low: str, hot: float) -> RunConfig:
        """The trace's model with the mix's quant section (the trial's own, `to_config`), on one rank."""
        from moetune.quant.names import backend_formats

        backend = self.backend if QUANT_FORMATS[low] in backend_formats(self.backend) else "torch"
        data = {"model": {**self.model.model.model_dump(), "kernel_backend": backend}}
        base = parse_config(data, source="search quality")
        return to_config(base, Deployment(quant_low_format=low, quant_hot_fraction=hot), loads=self.loads)

    def entries(self) -> list[dict]:
        """The cached points of this checkpoint and size (the report's quality table)."""
        ident, size = self.identity(), asdict(self.size)
        out = []
        for key, entry in read_cache(self.path).items():
            k = json.loads(key)
            if k["checkpoint"] == ident and k["size"] == size:
                out.append(entry)
        return sorted(out, key=lambda e: (e["format"], e["hot_fraction"]))


def eval_texts() -> tuple[list[str], str]:
    """`moetune eval`'s defaults: the bundled held-out prompts and perplexity sample."""
    from moetune.model.registry import bundled_asset
    from moetune.profile.workload import Workload, load_prompt_texts, prompts_path

    return load_prompt_texts(prompts_path(Workload())), bundled_asset("eval/heldout-sample.txt").read_text("utf-8")


def read_cache(path: Path) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data.get("points", {}) if isinstance(data, dict) else {}


def store(path: Path, key: str, entry: dict) -> None:
    """Merge one point into the cache under a lock (workers share it); written to a temporary name, renamed."""
    import fcntl
    import os

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        points = {**read_cache(path), key: entry}
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"what": "KL / top-1 of each low-bit mix vs its reference (moetune search)",
                                   "points": points}, indent=1, sort_keys=True))
        tmp.replace(path)


@dataclass
class QualityEvaluator:
    """An evaluator whose metrics also carry the mix's quality (`detail`: kl, top1_agreement)."""

    inner: object  # Evaluator
    lookup: QualityLookup

    @property
    def name(self) -> str:
        return self.inner.name

    def check(self, d: Deployment) -> str | None:
        return self.inner.check(d)

    def memory_rule(self):
        return self.inner.memory_rule()

    def evaluate(self, d: Deployment) -> Metrics:
        m = self.inner.evaluate(d)
        return replace(m, detail={**m.detail, **self.lookup.quality(d)})


def quality_label(lookup: QualityLookup | None) -> str:
    """What the KL / top-1 columns were measured on (a scaled search: the trace's model stands in)."""
    if lookup is None:
        return ""
    s = lookup.size
    name = Path(lookup.identity()["dir"]).name
    where = f"on {name}, the trace's model" + (f", standing in for {lookup.stand_in} (no weights)"
                                                if lookup.stand_in else "")
    return (f"KL (nats) and top-1 agreement vs the full-precision reference, measured by moetune eval {where}: "
            f"{s.num_prompts} prompts × {s.prompt_tokens} tokens; cached in {lookup.path.name}")
