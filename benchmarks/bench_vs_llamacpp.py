"""moetune against llama.cpp (llama-cpp-python 0.3.36 built from its source package) on the same
weights, the two taking turns, on the CPU: fp32 vs f32, int8 vs Q8_0, int4-g32 vs Q4_0.

  python benchmarks/make_cpu_bench_models.py mixtral /tmp/m364         # the Mixtral-style 364M
  python benchmarks/bench_vs_llamacpp.py --model /tmp/m364 [--rounds 2] [--threads 2]
      [--venv ~/.cache/moetune-bench/llamacpp] [--cmake-args "-DGGML_NATIVE=ON"] [--lock /work/cpu.lock]
      [--precisions fp32,int8,int4-g32] [--workloads prefill,b=1,b=16] [--wait auto|spin|sleep]
      [--write-doc] [--doc-host NAME]

Once (cached under --work and --venv, outside the repository): a venv with llama-cpp-python built
from its sdist (`pip install --no-binary`, CMAKE_ARGS = --cmake-args: a native CPU build by default)
and the converter's packages (torch, transformers; gguf from PyPI, though the converter needs the
newer gguf-py its sdist ships, put first on its path); the checkpoint converted to an f32 GGUF by the
converter the sdist ships (vendor/llama.cpp/convert_hf_to_gguf.py, through `SHIM`), then Q8_0 and
Q4_0 by llama.cpp's own quantizer (`llama_model_quantize`, pure: every 2-D weight in that type but
the router, as moetune's --policy F --dense F packs every projection); the same checkpoint packed by
`moetune quantize --policy int8 --dense int8` and `--policy int4-g32 --dense int4-g32`.

Then one warm-up round and --rounds rounds (each under an exclusive flock of --lock when given, so
that a hold lasts one round): per precision and workload (prefill 512 tokens; decode b=1 and b=16, 32
steps after a 128-token prompt a sequence; moetune's bench workloads, `bench/throughput.py`) one run
of each engine, the order swapped every round, each run preceded by a sample of the read limit.
Prints tok/s per engine (median, min–max), moetune ÷ llama.cpp per round, the share of the read
limit moetune's decode reached, the read probe, load, CPU flags, and the kernels' instruction set.
moetune's OpenMP wait (`engine/threads.py: choose_wait_policy`: spin on a quiet machine, sleep on a
busy one) is chosen while holding --lock, i.e. on the machine the rounds will find: chosen before
the lock, on a shared machine, it read busy and slept, and its b=1 figures were 0.81-0.92x of
llama.cpp's where spinning gave 0.83x (fp32) and 1.44x (int8) (docs/cpu.md). --wait spin (or sleep)
forces moetune's instead (GOMP_SPINCOUNT as the quiet choice sets it; llama.cpp's environment is left
as it was): under the lock the machine is quiet for the rounds, but other sessions' runnable tasks at
the moment of the choice can still read busy. --write-doc writes
the table into its section of docs/cpu.md (`vs-llamacpp-<kernel variant>`, between its markers).

An AVX2-only host emulated on an AVX-512 one (docs/cpu.md): MOETUNE_CPU_ISA=avx2 (moetune's numba
kernels compiled for Haswell's features, `kernels/cpu/isa.py`), ATEN_CPU_CAPABILITY=avx2,
ONEDNN_MAX_CPU_ISA=AVX2, MKL_ENABLE_INSTRUCTIONS=AVX2 (torch's prefill GEMMs), and --run-venv naming
a venv whose llama_cpp/lib/libggml-cpu.so was built with GGML_NATIVE=OFF GGML_AVX2=ON (no AVX-512).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import random
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

LLAMA_VERSION = "0.3.36"
PAIRS = {"fp32": ("f32", None), "int8": ("q8_0", "int8"), "int4-g32": ("q4_0", "int4-g32")}  # moetune: (GGUF, --policy/--dense)
WORKER = Path(__file__).with_name("llamacpp_worker.py")
CPU_DOC = Path(__file__).resolve().parents[1] / "docs" / "cpu.md"  # --write-doc: its `vs-llamacpp-<isa>` sections
CONVERTER_DEPS = ["gguf", "torch", "transformers", "safetensors", "sentencepiece", "numpy"]


def _run(cmd: list[str], **kw) -> None:
    print("  $", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)


BUILT_WITH = "moetune-cmake-args.txt"  # in a venv this script built: the CMAKE_ARGS of its llama.cpp


def ensure_venv(venv: Path, cmake_args: str) -> Path:
    """The venv's python, with llama-cpp-python built from source (once) and the converter's packages;
    the CMAKE_ARGS it was built with are kept in the venv (`built_with`)."""
    py = venv / "bin" / "python"
    if py.exists() and subprocess.run([str(py), "-c", "import llama_cpp, gguf, torch"]).returncode == 0:
        return py
    print(f"building llama-cpp-python {LLAMA_VERSION} from source into {venv} (CMAKE_ARGS={cmake_args})")
    _run([sys.executable, "-m", "venv", str(venv)])
    _run([str(py), "-m", "pip", "install", "-q", "scikit-build-core", "cmake", "ninja", "typing-extensions",
          "diskcache", "jinja2", *CONVERTER_DEPS])
    env = dict(os.environ, CMAKE_ARGS=cmake_args, CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 2))
    # --no-cache-dir: pip would otherwise install the wheel it built for another venv, whatever CMAKE_ARGS say
    _run([str(py), "-m", "pip", "install", "--no-cache-dir", "--no-build-isolation", "--no-binary", "llama-cpp-python",
          f"llama-cpp-python=={LLAMA_VERSION}"], env=env)
    (venv / BUILT_WITH).write_text(cmake_args + "\n")
    return py


def built_with(venv: Path) -> str:
    """How the header names a venv's llama.cpp build: the CMAKE_ARGS this script built it with, or
    where they are not recorded (a venv built otherwise) only its path; llama.cpp's own system info,
    printed beside it, lists the instruction sets the build uses either way."""
    kept = venv / BUILT_WITH
    return f"{venv}, CMAKE_ARGS {kept.read_text().strip()}" if kept.exists() else f"{venv} (build flags not recorded)"


# The converter run through a shim: PyPI's gguf lags the converter (no LazyChunkedTensor), so the
# sdist's own gguf-py goes first on the path; and a tokenizer whose pre-tokenizer hash the converter
# does not know (the bench models carry the bundled model's BPE) is written as "default" instead of
# refused: the bench feeds token ids, so the tokenizer plays no part in the timings.
SHIM = """
import runpy, sys
script = sys.argv[1]
sys.path.insert(0, script.rsplit("/", 1)[0])
import conversion.base as base
strict = base.TextModel.get_vocab_base_pre
def lenient(self, tokenizer):
    try:
        return strict(self, tokenizer)
    except NotImplementedError:
        return "default"
base.TextModel.get_vocab_base_pre = lenient
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
"""


def converter(py: Path, work: Path) -> Path:
    """convert_hf_to_gguf.py (with its conversion/ package and gguf-py) from the sdist, extracted under work."""
    root = work / f"llama_cpp_python-{LLAMA_VERSION}" / "vendor" / "llama.cpp"
    script = root / "convert_hf_to_gguf.py"
    if script.exists():
        return script
    sdist = work / f"llama_cpp_python-{LLAMA_VERSION}.tar.gz"
    if not sdist.exists():
        _run([str(py), "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", str(work),
              f"llama-cpp-python=={LLAMA_VERSION}"])
    want = ("/vendor/llama.cpp/convert_hf_to_gguf.py", "/vendor/llama.cpp/conversion/", "/vendor/llama.cpp/gguf-py/")
    with tarfile.open(sdist) as tar:
        tar.extractall(work, members=[m for m in tar.getmembers() if any(w in m.name for w in want)],
                       filter="data")
    return script


class Worker:
    """llamacpp_worker.py in the llama venv: one JSON request / answer a line."""

    def __init__(self, py: Path, log: Path, env: dict[str, str]):
        self._log = log.open("a")
        self._p = subprocess.Popen([str(py), str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=self._log, text=True, env=env)

    def __call__(self, **req) -> dict:
        self._p.stdin.write(json.dumps(req) + "\n")
        self._p.stdin.flush()
        answer = json.loads(self._p.stdout.readline() or '{"error": "the llama.cpp worker died (see its log)"}')
        if "error" in answer:
            raise RuntimeError(f"llama.cpp worker, {req['op']}: {answer['error']}")
        return answer

    def close(self) -> None:
        self._p.stdin.close()
        self._p.wait(timeout=60)
        self._log.close()


def prepare(model: Path, work: Path, py: Path, worker: Worker, threads: int) -> dict[str, tuple[Path, Path]]:
    """precision → (moetune checkpoint, GGUF), converted / quantized once."""
    script = converter(py, work)
    f32 = work / "model-f32.gguf"
    if not f32.exists():
        env = dict(os.environ, PYTHONPATH=str(script.parent / "gguf-py"))
        _run([str(py), "-c", SHIM, str(script), str(model), "--outtype", "f32", "--outfile", str(f32)], env=env)
    out = {}
    for name, (ftype, fmt) in PAIRS.items():
        gguf = f32 if ftype == "f32" else work / f"model-{ftype}.gguf"
        if not gguf.exists():
            worker(op="quantize", src=str(f32), dst=str(gguf), ftype=ftype, threads=threads)
        ours = model if fmt is None else work / f"moetune-{fmt}"
        if not (ours / "config.json").exists():
            _run([sys.executable, "-m", "moetune", "quantize", "-m", str(model), "--policy", fmt, "--dense", fmt,
                  "-o", str(ours), "--threads", str(threads)])
        out[name] = (ours, gguf)
    return out


@contextlib.contextmanager
def held(lock: str | None):
    """An exclusive flock of `lock` for the block (none: no lock)."""
    if lock is None:
        yield
        return
    with open(lock, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _moetune_run(plan) -> float:
    work = plan.work
    arg = work.setup() if work.setup is not None else None
    start = time.perf_counter()
    work.fn(arg) if work.setup is not None else work.fn()
    return time.perf_counter() - start


def _llama_run(worker: Worker, name: str, workload: str, s, vocab: int, seed: int) -> float:
    if workload.startswith("prefill"):
        rng = random.Random(seed)
        return worker(op="prefill", name=name, tokens=[rng.randrange(3, vocab) for _ in range(s.prefill_len)])["seconds"]
    b = int(workload.split("b=")[1])
    return worker(op="decode", name=name, batch=b, context=s.decode_context, steps=s.decode_steps,
                  seed=seed + b)["seconds"]


def rounds(ours: dict, worker: Worker, s, sampler, n_rounds: int, lock: str | None, vocab: int) -> dict:
    """(precision, workload) → {"moetune": [s], "llama.cpp": [s], "read": [GB/s]}; round 0 warms up."""
    times: dict = {}
    for r in range(n_rounds + 1):
        with held(lock):
            print(f"round {r}{' (warm-up)' if r == 0 else ''}: load {os.getloadavg()[0]:.2f}", flush=True)
            for name, plans in ours.items():
                for plan in plans:
                    rec = times.setdefault((name, plan.workload), {"moetune": [], "llama.cpp": [], "read": []})
                    sides = ["moetune", "llama.cpp"] if r % 2 else ["llama.cpp", "moetune"]
                    for side in sides:
                        read = sampler.sample("read")
                        t = (_moetune_run(plan) if side == "moetune"
                             else _llama_run(worker, name, plan.workload, s, vocab, 1000 + r))
                        if r:
                            rec[side].append(t)
                            rec["read"].append(read)
                        print(f"  {name} {plan.workload}: {side} {plan.tokens / t:.1f} tok/s", flush=True)
    return times


def bytes_per_run(plan, s) -> float:
    """Weight bytes one decode run of `plan` reads: its counters cleared, one more untimed run, read.
    (The plans of one model share the expert counter, and the rounds interleave them, so the counts
    of the timed runs cannot be told apart; every run decodes the same tokens, so one run tells.)"""
    from moetune.bench.throughput import WARMUP

    plan.bytes_read()  # clears the step count and the routed experts so far
    _moetune_run(plan)
    return plan.bytes_read() * (s.runs + WARMUP)  # read() divides by the bench's runs + warm-up


def table(ours: dict, times: dict, s) -> list[str]:
    lines = ["| precision | workload | moetune tok/s | llama.cpp tok/s | moetune ÷ llama.cpp (per round) "
             "| moetune GB/s · % of read probe |", "|---|---|---|---|---|---|"]
    for name, plans in ours.items():
        for plan in plans:
            rec = times[(name, plan.workload)]
            m, ll = rec["moetune"], rec["llama.cpp"]
            rate = [plan.tokens / t for t in m]
            lrate = [plan.tokens / t for t in ll]
            ratios = sorted(b / a for a, b in zip(m, ll))
            probe = statistics.median(rec["read"])
            if plan.bytes_read is not None:
                gbs = bytes_per_run(plan, s) / statistics.median(m) / 1e9
                read = f"{gbs:.1f} GB/s · {gbs / probe:.0%} of {probe:.1f}"
            else:
                read = f"probe {probe:.1f} GB/s"
            lines.append(f"| {name} | {plan.workload} | {statistics.median(rate):.1f} ({min(rate):.1f}–{max(rate):.1f}) "
                         f"| {statistics.median(lrate):.1f} ({min(lrate):.1f}–{max(lrate):.1f}) "
                         f"| {statistics.median(ratios):.2f}× ({ratios[0]:.2f}–{ratios[-1]:.2f}) | {read} |")
    return lines


def _wanted(workload: str, wanted: str) -> bool:
    """Whether `workload` ("prefill b=1 len=512", "decode b=16") is one of --workloads."""
    kind = "prefill" if workload.startswith("prefill") else workload.split()[-1]
    return kind in wanted.split(",")


def cpu_flags() -> str:
    try:
        flags = next(ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")).split()
    except (OSError, StopIteration):
        return "unknown"
    keep = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8")
    return " ".join(f for f in keep if f in flags)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="checkpoint directory (make_cpu_bench_models.py)")
    p.add_argument("--work", default=str(Path.home() / ".cache" / "moetune-bench" / "vs-llamacpp"),
                   help="where the GGUFs and moetune's packed checkpoints are cached")
    p.add_argument("--venv", default=str(Path.home() / ".cache" / "moetune-bench" / "llamacpp"),
                   help="llama-cpp-python's venv (built here when missing) that converts and quantizes")
    p.add_argument("--run-venv", default=None,
                   help="another venv with llama_cpp (e.g. its CPU backend built for AVX2) that runs the timings")
    p.add_argument("--cmake-args", default="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--precisions", default=",".join(PAIRS))
    p.add_argument("--workloads", default="prefill,b=1,b=16",
                   help="which workloads to time (a subset of prefill, b=1, b=16)")
    p.add_argument("--lock", default=None, help="hold an exclusive flock of this file during each round")
    p.add_argument("--wait", choices=("auto", "spin", "sleep"), default="auto",
                   help="moetune's OpenMP wait: chosen from the machine under --lock (auto), or forced")
    p.add_argument("--doc-host", default=None,
                   help="with --write-doc: a name for this host in the section's key (vs-llamacpp-<isa>-<name>), "
                        "so that tables of other hosts stay")
    p.add_argument("--write-doc", action="store_true",
                   help="also write the table into its section of docs/cpu.md (benchmarks/doc_section.py), "
                        "one section per kernel variant: vs-llamacpp-avx2, vs-llamacpp-avx512-vnni, ...")
    args = p.parse_args()
    work = Path(args.work) / Path(args.model).resolve().name
    work.mkdir(parents=True, exist_ok=True)
    llama_env = dict(os.environ)  # llama.cpp keeps its own OpenMP defaults (moetune's wait policy is set below)

    from moetune.engine.threads import SPIN_COUNT, choose_wait_policy, use_threads

    if args.wait == "spin":
        os.environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
    elif args.wait == "sleep":
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    with held(args.lock):  # the machine as the rounds will find it: quiet under the lock, busy without
        print(f"moetune OpenMP wait: {choose_wait_policy()} ({args.wait})", flush=True)
    use_threads(args.threads)
    import torch

    from moetune.bench.roofline import LimitSampler
    from moetune.bench.throughput import BenchSettings, plan_moetune
    from moetune.config import parse_config
    from moetune.engine.build import build_model
    from moetune.kernels.cpu import isa

    py = ensure_venv(Path(args.venv), args.cmake_args)
    worker = Worker(py, work / "worker.log", llama_env)
    paths = prepare(Path(args.model), work, py, worker, args.threads)
    if args.run_venv is not None:
        worker.close()
        worker = Worker(Path(args.run_venv) / "bin" / "python", work / "worker.log", llama_env)
    info = worker(op="info")
    names = [n for n in args.precisions.split(",") if n]
    s = BenchSettings(decode_batches=(1, 16), runs=args.rounds)
    ours, finish, vocab = {}, [], 0
    for name in names:
        model = build_model(parse_config({"model": {"path": str(paths[name][0])}}, source="bench_vs_llamacpp"))
        plans, done = plan_moetune(model, s)
        ours[name], vocab = [p for p in plans if _wanted(p.workload, args.workloads)], model.spec.vocab_size
        finish.append(done)
        worker(op="load", name=name, path=str(paths[name][1]), threads=args.threads)
    sampler = LimitSampler(torch.device("cpu"))
    load0 = os.getloadavg()
    times = rounds(ours, worker, s, sampler, args.rounds, args.lock, vocab)
    load1 = os.getloadavg()
    lines = table(ours, times, s)  # (runs each decode plan once more, untimed, to count its bytes)
    for done in finish:
        done()
    worker.close()
    from moetune.engine.threads import wait_policy

    print(f"\nmodel {args.model} · threads {args.threads} · rounds {args.rounds} (+1 warm-up) · "
          f"load {load0[0]:.2f} → {load1[0]:.2f} · moetune OpenMP wait: {wait_policy()} · llama.cpp's: "
          f"{llama_env.get('OMP_WAIT_POLICY', 'OpenMP default')}")
    emulate = " ".join(f"{k}={os.environ[k]}" for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA",
                                                         "MKL_ENABLE_INSTRUCTIONS") if k in os.environ)
    print(f"CPU flags: {cpu_flags()} · moetune kernels: {isa.describe()} · torch kernels: "
          f"{torch.backends.cpu.get_cpu_capability()}{' (' + emulate + ')' if emulate else ''}")
    built = built_with(Path(args.run_venv or args.venv))
    print(f"llama-cpp-python {info['version']} ({built}): {info['system_info'].strip()}")
    print("\n".join(lines))
    if args.write_doc:
        from doc_section import section, write_section  # benchmarks/doc_section.py, beside this script

        key = f"vs-llamacpp-{isa.choose()}" + (f"-{args.doc_host}" if args.doc_host else "")
        header = [f"CPU flags: {cpu_flags()} · moetune kernels: {isa.describe()} · torch kernels: "
                  f"{torch.backends.cpu.get_cpu_capability()}{' (' + emulate + ')' if emulate else ''}",
                  f"llama.cpp: {built} · moetune OpenMP wait: {wait_policy()} · llama.cpp's: "
                  f"{llama_env.get('OMP_WAIT_POLICY', 'OpenMP default')} · threads {args.threads} · "
                  f"rounds {args.rounds} (+1 warm-up)", ""]
        host = f", host {args.doc_host}" if args.doc_host else ""
        write_section(key, section(key, f"moetune vs llama.cpp, kernels {isa.choose()}{host} (tok/s median (min–max) "
                                   "of rounds taken in turn)", header + lines, f"{load0[0]:.2f}", f"{load1[0]:.2f}"),
                      CPU_DOC)
        print(f"wrote its section ({key}) of {CPU_DOC}")

if __name__ == "__main__":
    main()
