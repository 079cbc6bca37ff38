"""Launch configs of the grouped expert GEMMs, as data.

Files use the vLLM / SGLang naming `E={E},N={N},device_name={name}[,dtype={dtype}].json`
(N = expert intermediate size I) with batch sizes as string keys and values
{BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M, num_warps, num_stages}. vLLM and SGLang
read that file for both GEMMs; we also tune the w2 ("down") GEMM on its own and store it next to
it with a `_down` suffix. Both files of one shape share BLOCK_SIZE_M: the aligned layout is built
once per layer for both GEMMs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import torch

from moetune.kernels.quant_formats import WeightFormat

Gemm = Literal["up", "down"]
CONFIG_DIR = Path(__file__).parent / "configs"
_DTYPE_SELECTOR = {
    WeightFormat.NONE: None, WeightFormat.INT8: "int8_w8a16",
    WeightFormat.INT4: "int4_w4a16", WeightFormat.FP8: "fp8_w8a16",
}


@dataclass(frozen=True)
class GemmConfig:
    block_m: int = 64
    block_n: int = 64
    block_k: int = 32
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3

    def to_json(self) -> dict[str, int]:
        return {"BLOCK_SIZE_M": self.block_m, "BLOCK_SIZE_N": self.block_n, "BLOCK_SIZE_K": self.block_k,
                "GROUP_SIZE_M": self.group_m, "num_warps": self.num_warps, "num_stages": self.num_stages}

    @classmethod
    def from_json(cls, d: dict) -> "GemmConfig":
        return cls(d["BLOCK_SIZE_M"], d["BLOCK_SIZE_N"], d["BLOCK_SIZE_K"], d.get("GROUP_SIZE_M", 1),
                   d.get("num_warps", 4), d.get("num_stages", 3))

    def with_block_m(self, block_m: int) -> "GemmConfig":
        return replace(self, block_m=block_m)


ConfigTable = dict[int, GemmConfig]  # batch size M → config


def device_name(device: torch.device) -> str:
    """`torch.cuda.get_device_name` with spaces as underscores (the vLLM spelling); 'cpu' off CUDA."""
    if device.type != "cuda":
        return "cpu"
    return torch.cuda.get_device_name(device).replace(" ", "_")


def config_file_name(E: int, N: int, device: str, fmt: WeightFormat = WeightFormat.NONE, gemm: Gemm = "up") -> str:
    dtype = _DTYPE_SELECTOR[WeightFormat(fmt)]
    selector = "" if dtype is None else f",dtype={dtype}"
    suffix = "_down" if gemm == "down" else ""
    return f"E={E},N={N},device_name={device}{selector}{suffix}.json"


def load_table(path: Path) -> ConfigTable:
    raw = json.loads(Path(path).read_text())
    return {int(m): GemmConfig.from_json(v) for m, v in raw.items()}


def save_table(path: Path, table: ConfigTable) -> None:
    """Write atomically (temp file + rename) so a crash never leaves half a file."""
    path = Path(path)
    body = json.dumps({str(m): table[m].to_json() for m in sorted(table)}, indent=4) + "\n"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(body)
    tmp.replace(path)


def nearest(table: ConfigTable, m: int) -> GemmConfig:
    """The entry whose batch size is closest to m (ties: the smaller batch size)."""
    return table[min(table, key=lambda key: (abs(key - m), key))]


def default_config(m: int, num_experts: int, top_k: int) -> GemmConfig:
    """Without a tuned file: small tiles when each expert sees few rows, bigger ones otherwise."""
    rows_per_expert = m * top_k / max(num_experts, 1)
    if rows_per_expert <= 16:
        return GemmConfig(block_m=16, block_n=64, block_k=64, group_m=1, num_warps=4, num_stages=3)
    if rows_per_expert <= 128:
        return GemmConfig(block_m=32, block_n=64, block_k=64, group_m=8, num_warps=4, num_stages=3)
    return GemmConfig(block_m=64, block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=3)


def find_table(E: int, N: int, device: str, fmt: WeightFormat, gemm: Gemm,
               config_dir: Path | None = None) -> ConfigTable | None:
    path = Path(config_dir or CONFIG_DIR) / config_file_name(E, N, device, fmt, gemm)
    return load_table(path) if path.exists() else None
