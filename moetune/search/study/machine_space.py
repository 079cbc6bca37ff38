"""A this-machine search's space: only what this machine's kernel backend runs, plus the dense
projections' precision moetune's own engine serves (`quant.dense`, `moetune quantize --dense`).

- `quant_low_format`: the formats the recipe's kernel backend computes (space.py
  `runnable_formats`: fp8 experts are dropped under the `cpu` backend; named in --space: one line).
- `dense_format` on this machine: none | int8 | int4 (int4 = group 64), written as the recipe's
  `quant.dense` (`int8`, `int4-g64`); searched when --space names it (else the base recipe's, as the
  NAMED_ONLY knobs of space.py), and then only the formats the backend computes: fp8 (the GPU
  engines') or one the backend lacks is refused in one line. It is priced from this machine's
  measured kernel rates: a one-rank deployment with a dense format is a "variant" whose own path
  (calibrate.py `variant_key`, microbench.py `run_variant_bench`) is timed against the fp32 model,
  and its step is priced as fp32 × that ratio (simulate.py); at R > 1 the ranks' factor is the
  fp32 model's and the dense bytes are priced by the roofline (not timed on their own).
"""

from __future__ import annotations

from dataclasses import replace

from moetune.search.cost.precision import DENSE_QUANT
from moetune.search.study.space import Knob, Space, SpaceError, runnable_formats

MACHINE_DENSE = ("none", *DENSE_QUANT)
KNOB = Knob("dense_format", "quant.dense", MACHINE_DENSE, "attention / dense / shared-expert / LM-head weights")


def machine_space(space: Space, backend: str, explicit_low: bool, dense: object = None,
                  base_dense: str = "none") -> Space:
    """`space` narrowed to what `backend` runs here, with the dense knob: `dense` is --space's
    dense_format (a value or a list); not named, it keeps the base recipe's (`base_dense`, the knob
    value of its quant.dense) and is left out of the space where that is none (a default space's
    grid and trial budget stay as they were)."""
    from moetune.quant.names import backend_formats

    space = runnable_formats(space, backend, explicit_low)
    allowed = backend_formats(backend)
    runs = tuple(v for v in MACHINE_DENSE if v == "none" or DENSE_QUANT[v] in allowed)
    knobs = tuple(k for k in space.knobs if k.name != "dense_format")
    if dense is None:
        return Space(knobs) if base_dense == "none" else Space((*knobs, replace(KNOB, values=(base_dense,))))
    values = tuple(str(v) for v in (dense if isinstance(dense, (list, tuple)) else (dense,)))
    bad = [v for v in values if v not in runs]
    if bad or not values:
        raise SpaceError(f"--space: dense_format {bad[0] if bad else '(no values)'}: this machine's kernel backend "
                         f"'{backend}' runs {', '.join(runs)}")
    return Space((*knobs, replace(KNOB, values=values)))
