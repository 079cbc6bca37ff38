"""PrecisionTable: the format of every routed expert, per MoE layer × expert.

Built three ways:
  uniform(fmt, layers, E)                         every expert in one format
  hot_fraction(loads [Lm, E], layers, f, hi, lo)  per layer, the ceil(f·E) experts with the most
                                                  profiled token copies keep `hi`, the rest `lo`
                                                  (ties: lower expert id first)
  read_table(path, layers, E)                     a JSON file (below)

Table file: {"default": "int4-g64", "layers": {"0": ["fp32", "int8", ...E names], "3": "int8"}}
— a layer maps to a list of E names or one name for all its experts; layers not listed take
"default" (required when not every layer is listed). Attention, router and shared experts are not
in the table: they keep the load dtype.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from moetune.quant.names import QuantError, parse_name as parse_format


@dataclass(frozen=True)
class PrecisionTable:
    formats: dict[int, tuple[str, ...]]  # MoE layer → format name per logical expert [E]

    def __post_init__(self):
        for names in self.formats.values():
            for name in set(names):
                parse_format(name)

    def layer(self, layer: int) -> tuple[str, ...]:
        return self.formats[layer]

    def names(self) -> set[str]:
        return {n for names in self.formats.values() for n in names}

    def check_for(self, layers: list[int], num_experts: int, where: str = "precision table") -> None:
        missing = sorted(set(layers) - set(self.formats))
        if missing:
            raise QuantError(f"{where} has no formats for MoE layer {missing[0]}")
        for layer in layers:
            if len(self.formats[layer]) != num_experts:
                raise QuantError(f"{where}: layer {layer} lists {len(self.formats[layer])} experts; "
                                 f"the model has {num_experts}")

    def to_json(self) -> dict:
        return {str(layer): list(names) for layer, names in sorted(self.formats.items())}

    @classmethod
    def from_json(cls, data: dict) -> "PrecisionTable":
        return cls({int(layer): tuple(names) for layer, names in data.items()})

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for names in self.formats.values():
            for n in names:
                out[n] = out.get(n, 0) + 1
        return out


def uniform(fmt: str, layers: list[int], num_experts: int) -> PrecisionTable:
    parse_format(fmt)
    return PrecisionTable({layer: (fmt,) * num_experts for layer in layers})


def hot_fraction(loads: np.ndarray, layers: list[int], fraction: float, high: str, low: str) -> PrecisionTable:
    """loads [Lm, E] token copies per expert, row j for MoE layer layers[j]."""
    if not 0.0 <= fraction <= 1.0 or not math.isfinite(fraction):
        raise QuantError(f"hot fraction {fraction} must be within [0, 1]")
    if loads.shape[0] != len(layers):
        raise QuantError(f"expert loads cover {loads.shape[0]} MoE layers; the model has {len(layers)}")
    parse_format(high), parse_format(low)
    E = loads.shape[1]
    hot = math.ceil(fraction * E - 1e-9)
    out = {}
    for j, layer in enumerate(layers):
        order = np.argsort(-loads[j], kind="stable")  # [E] most loaded first, ties by id
        names = [low] * E
        for e in order[:hot]:
            names[int(e)] = high
        out[layer] = tuple(names)
    return PrecisionTable(out)


def read_table(path: Path, layers: list[int], num_experts: int) -> PrecisionTable:
    """A table file (module docstring) → PrecisionTable for these MoE layers."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise QuantError(f"cannot read precision table '{path}': {exc.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise QuantError(f"precision table '{path}' is not JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("layers", {}), dict):
        raise QuantError(f"precision table '{path}' must be an object with 'layers' (and 'default')")
    default, given = data.get("default"), data.get("layers", {})
    out = {}
    for layer in layers:
        entry = given.get(str(layer), default)
        if entry is None:
            raise QuantError(f"precision table '{path}' has no formats for MoE layer {layer} and no 'default'")
        names = (entry,) * num_experts if isinstance(entry, str) else entry
        if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
            raise QuantError(f"precision table '{path}': layer {layer} must be a format name or a list of names")
        out[layer] = tuple(names)
    extra = sorted(set(given) - {str(layer) for layer in layers})
    if extra:
        raise QuantError(f"precision table '{path}' names layer {extra[0]}, which is not a MoE layer "
                         f"(MoE layers: {', '.join(map(str, layers))})")
    table = PrecisionTable(out)
    table.check_for(layers, num_experts, f"precision table '{path}'")
    return table


def parse_policy(text: str) -> dict:
    """'int8' → {"experts": "int8"}; 'hot=0.25,high=fp32,low=int4-g64' → {"hot_fraction": 0.25, ...}
    (high defaults to fp32, low to int4-g64): the shapes of the recipe's quant section."""
    if "=" not in text:
        parse_format(text)
        return {"experts": text}
    out: dict = {"high": "fp32", "low": "int4-g64"}
    for part in text.split(","):
        key, _, value = part.partition("=")
        key = key.strip()
        if key == "hot":
            try:
                out["hot_fraction"] = float(value)
            except ValueError:
                raise QuantError(f"policy '{text}': hot={value} is not a number") from None
        elif key in ("high", "low"):
            parse_format(value.strip())
            out[key] = value.strip()
        else:
            raise QuantError(f"policy '{text}': unknown key '{key}' (use FORMAT, or hot=F,high=FORMAT,low=FORMAT)")
    if "hot_fraction" not in out:
        raise QuantError(f"policy '{text}' needs hot=F (the fraction of experts kept in the high format)")
    return out
