"""A this-machine search's space: only what this machine's kernel backend runs, plus the dense
projections' precision moetune's own engine serves (`quant.dense`, `moetune quantize --dense`).

- `quant_low_format`: the formats the recipe's kernel backend computes (space.py
  `runnable_formats`: fp8 experts are dropped under the `cpu` backend; named in --space: one line).
- `dense_format` on this machine: none | int8 | int4 (int4 = group 64), written as the recipe's
  `quant.dense` (`int8`, `int4-g64`); a format the backend does not compute is dropped (named in
  --space: one line), fp8 is the GPU engines' and refused here. It is priced from this machine's
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


def machine_space(space: Space, backend: str, explicit_low: bool, dense: object = None) -> Space:
    """`space` narrowed to what `backend` runs here, with the dense knob: `dense` is --space's
    dense_format (a value or a list; None: searched over none, int8, int4)."""
    from moetune.quant.names import backend_formats

    space = runnable_formats(space, backend, explicit_low)
    allowed = backend_formats(backend)
    if dense is None:
        values = tuple(v for v in MACHINE_DENSE if v == "none" or DENSE_QUANT[v] in allowed)
    else:
        values = tuple(str(v) for v in (dense if isinstance(dense, (list, tuple)) else (dense,)))
        bad = [v for v in values if v not in MACHINE_DENSE or (v != "none" and DENSE_QUANT[v] not in allowed)]
        if bad or not values:
            what = bad[0] if bad else "(no values)"
            raise SpaceError(f"--space: dense_format {what}: this machine's kernel backend '{backend}' runs "
                             f"{', '.join(v for v in MACHINE_DENSE if v == 'none' or DENSE_QUANT[v] in allowed)}")
    knobs = tuple(k for k in space.knobs if k.name != "dense_format")
    return Space((*knobs, replace(KNOB, values=values)))
