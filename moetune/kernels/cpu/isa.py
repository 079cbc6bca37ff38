"""Which instruction set the CPU kernels are compiled for, chosen once per process at run time.

numba compiles every kernel for one target CPU (name + feature list, `NUMBA_CPU_NAME` /
`NUMBA_CPU_FEATURES`, else the host's), and its disk cache is keyed on that target, so one source
gives one variant per instruction set. The integer tiles (`_simd.py`) follow the features: 32 int16
lanes with AVX-512BW (`vpmaddwd zmm`, fused into VNNI's `vpdpwssd` where the CPU has it), 16 with
AVX2 (`vpmaddwd ymm`, `{vex} vpdpwssd` with AVX-VNNI), generic IR without AVX2.

  VARIANTS       best first: avx512-vnni, avx512, avx-vnni, avx2, generic
  host_variants  the variants this CPU can run (each needs its features)
  choose         the variant to compile for: MOETUNE_CPU_ISA when set (one of the host's variants,
                 else a user error), else the host's best; applied before the first kernel compiles
                 (`runtime.jit()`), by setting numba's target CPU and features for a lower variant
  describe       one line for `moetune bench` and env.json: the variant, what chose it, the host's best

A forced variant exists to measure and test the code another host gets (an AVX2-only Zen 2, say) on
this one: same arithmetic, the other host's instructions (tests/kernels/test_cpu_isa.py checks each
against the plain twin and reads its assembly). Importing this module imports nothing heavy.
"""

from __future__ import annotations

import functools
import os

ENV = "MOETUNE_CPU_ISA"
VARIANTS = ("avx512-vnni", "avx512", "avx-vnni", "avx2", "generic")
NEEDS = {  # features (LLVM's names) a variant's code uses
    "avx512-vnni": ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512vnni"),
    "avx512": ("avx2", "fma", "avx512f", "avx512bw", "avx512vl"),
    "avx-vnni": ("avx2", "fma", "avxvnni"),
    "avx2": ("avx2", "fma"),
    "generic": (),
}
_AVX2 = "+sse2,+sse3,+ssse3,+sse4.1,+sse4.2,+popcnt,+avx,+avx2,+fma,+f16c,+bmi,+bmi2,+lzcnt,+movbe"
_NO_512 = ",-avx512f,-avx512bw,-avx512vl,-avx512dq,-avx512cd,-avx512vnni,-avx512bf16,-avx512fp16,-avx512vbmi"
TARGETS = {  # a lower variant's numba target: (CPU name, features): the name alone keeps the host's features
    "avx512": ("skylake-avx512", _AVX2 + ",+avx512f,+avx512bw,+avx512vl,+avx512dq,+avx512cd,-avx512vnni,-avxvnni"),
    "avx-vnni": ("alderlake", _AVX2 + ",+avxvnni" + _NO_512),
    "avx2": ("haswell", _AVX2 + ",-avxvnni" + _NO_512),
    "generic": ("x86-64", "+sse2,-avx,-avx2,-fma,-avxvnni" + _NO_512),
}


class ISAError(ValueError):
    """MOETUNE_CPU_ISA names no variant, or one this CPU cannot run."""


@functools.cache
def host_features() -> frozenset[str]:
    """The host CPU's features as LLVM names them (what numba compiles for by default)."""
    from llvmlite import binding

    flat = binding.get_host_cpu_features().flatten()
    return frozenset(f[1:] for f in flat.split(",") if f.startswith("+"))


def variant_of(features: frozenset[str] | set[str]) -> str:
    """The best variant a feature set runs."""
    return next(v for v in VARIANTS if all(f in features for f in NEEDS[v]))


def host_variants() -> list[str]:
    """The variants this host can run, best first."""
    have = host_features()
    return [v for v in VARIANTS if all(f in have for f in NEEDS[v])]


def requested() -> str | None:
    """MOETUNE_CPU_ISA, checked against the variants and this host (ISAError: a user mistake)."""
    want = os.environ.get(ENV, "").strip().lower()
    if not want:
        return None
    if want not in VARIANTS:
        raise ISAError(f"{ENV}={want!r} is not a kernel variant; choose one of {', '.join(VARIANTS)}")
    if want not in host_variants():
        raise ISAError(f"{ENV}={want} needs {', '.join(NEEDS[want])}; this CPU runs {', '.join(host_variants())}")
    return want


@functools.cache
def choose() -> str:
    """The variant the kernels compile for in this process (called before the first compile): a
    forced lower variant sets numba's target CPU and features, unless NUMBA_CPU_NAME /
    NUMBA_CPU_FEATURES already say what to compile for (then those stand, and are reported)."""
    want = requested()
    if want is None or want == host_variants()[0] or "NUMBA_CPU_FEATURES" in os.environ:
        return compiled()
    name, features = TARGETS[want]
    os.environ["NUMBA_CPU_NAME"], os.environ["NUMBA_CPU_FEATURES"] = name, features
    import numba.core.config as config  # already imported: its values are read at the first compile

    config.CPU_NAME, config.CPU_FEATURES = name, features
    return compiled()


def compiled() -> str:
    """The variant of the features numba compiles for now (NUMBA_CPU_FEATURES, else the host's)."""
    from numba.core import config

    if config.CPU_FEATURES is None:
        return variant_of(host_features())
    return variant_of({f[1:] for f in config.CPU_FEATURES.split(",") if f.startswith("+")})


def describe() -> str:
    """e.g. 'avx2 (MOETUNE_CPU_ISA; host best avx512-vnni)' — the kernels' variant and what chose it."""
    got = choose()
    best = host_variants()[0]
    if os.environ.get(ENV):
        how = f"{ENV}"
    elif "NUMBA_CPU_FEATURES" in os.environ:
        how = "NUMBA_CPU_FEATURES"
    else:
        how = "host"
    return got if how == "host" else f"{got} ({how}; host best {best})"
