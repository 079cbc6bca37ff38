"""The CPU kernels' instruction-set variants (`kernels/cpu/isa.py`): every variant this host can run,
forced with MOETUNE_CPU_ISA in a process of its own (numba compiles for that target into a cache of
its own), computes the int8 and int4 paths as their plain twins do on awkward shapes (odd N, K not a
multiple of the vector width, groups 32 / 64 / 128, 1 and several x rows, one-row int4 experts; the int4
numerics modes, the default's at 16 and 17 x rows, where it changes x's parts and the scales), its
assembly is that variant's (zmm only with AVX-512; VNNI's vpdpwssd only with VNNI; no ymm in the
generic code), and the process reports the variant it ran. A variant the host lacks, or a name that
is none, is refused with one line by the CLI."""

import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest
import torch

pytest.importorskip("numba")

from moetune.kernels.cpu import fused_experts_cpu_ref, isa, linear_ref  # noqa: E402
from moetune.kernels.cpu.linear import (linear_q4_ref, linear_q8_ref, q8_bound, quantize_rows_ref, x_block,  # noqa: E402
                                        x_levels)
from moetune.kernels.cpu import runtime  # noqa: E402
from moetune.kernels.cpu.formats import dequantize  # noqa: E402
from moetune.kernels.cpu.q4r import linear_q4r_ref, quantize_x_ref  # noqa: E402
from moetune.kernels.quant_formats import WeightFormat  # noqa: E402
from tests.cli_run import assert_one_line_error, moetune  # noqa: E402
from tests.kernels.test_cpu_q4r import experts_twin  # noqa: E402

SCRIPT = """
import sys, torch
from moetune.kernels.cpu import fused_experts_cpu, isa, linear, quantize_int4, quantize_int8, runtime
runtime.Q8_ROWS = runtime.Q4_ROWS = 16
def mode(few, many, fp16_few, fp16):
    runtime.Q4_X_PARTS_FEW, runtime.Q4_X_PARTS, runtime.Q4_SCALE_FP16_FEW, runtime.Q4_SCALE_FP16 = few, many, fp16_few, fp16
mode(1, 1, True, True)  # int4: llama.cpp's numerics (int8 x, fp16 scales) first
g = torch.Generator().manual_seed(3)
cases = [(quantize_int8(torch.randn(37, 1029, generator=g)), torch.randn(5, 1029, generator=g) * 3)]
cases += [(quantize_int4(torch.randn(11, 384, generator=g), grp), torch.randn(5, 384, generator=g))
          for grp in (32, 64, 128)]
ys = [(linear(x[:1], w, threads=1), linear(x, w, threads=1)) for w, x in cases]
w13 = quantize_int4(torch.randn(3, 2 * 64, 96, generator=g), 32)
w2 = quantize_int4(torch.randn(3, 96, 64, generator=g), 32)
off = torch.tensor([0, 1, 1, 2]); xe = torch.randn(2, 96, generator=g)
ye = fused_experts_cpu(xe, off, w13, w2, threads=1)
k = runtime.jit()
yp = {}  # then 2 and 3 x parts with fp32 scales (2: the exact mode's at these row counts)
for parts in (2, 3):
    mode(parts, parts, False, False)
    yp[parts] = [(linear(x[:1], w, threads=1), linear(x, w, threads=1)) for w, x in cases[1:]]
mode(2, 3, True, False)  # the default: 2 parts and fp16 scales up to 16 rows, 3 and fp32 beyond
x17 = [torch.randn(17, 384, generator=g) for _ in cases[1:]]
yd = [(linear(x[:16], w, threads=1), linear(x, w, threads=1)) for (w, _), x in zip(cases[1:], x17)]
offd = torch.tensor([0, 16, 16, 33]); xd = torch.randn(33, 96, generator=g)
yde = fused_experts_cpu(xd, offd, w13, w2, threads=1)
mode(1, 1, True, True)
runtime.Q4_INTERLEAVED = False  # the int16 int4 path too (the documented option)
ys16 = [(linear(x[:1], w, threads=1), linear(x, w, threads=1)) for w, x in cases[1:]]
asm = "".join(f.inspect_asm(f.signatures[0]) for f in (k.linear_q8_serial, k.linear_q4_serial))
asm4 = k.linear_q4r_serial.inspect_asm(k.linear_q4r_serial.signatures[0])
torch.save({"cases": cases, "y": ys, "y16": ys16, "parts": yp, "experts": (w13, w2, off, xe, ye),
            "default": (x17, yd, offd, xd, yde), "variant": isa.describe(),
            "zmm": "zmm" in asm, "ymm": "ymm" in asm, "vnni": "vpdpwssd" in asm, "madd": "vpmaddwd" in asm,
            "q4r": ("zmm" in asm4, "ymm" in asm4, "vpdpbusd" in asm4, "vpmaddubsw" in asm4),
            "q4r_prefetch": asm4.count("prefetcht1")},
           sys.argv[1])
"""

ASM_Q4R = {  # the interleaved int4 kernel (`_simd_q4r`): (zmm, ymm, VNNI's vpdpbusd, vpmaddubsw)
    "avx512-vnni": (True, None, True, False),
    "avx512": (True, None, False, True),
    "avx-vnni": (False, True, True, False),
    "avx2": (False, True, False, True),
    "generic": (False, False, False, False),
}
ASM = {  # variant: (zmm registers, ymm registers, VNNI's vpdpwssd, vpmaddwd)
    "avx512-vnni": (True, None, True, None),
    "avx512": (True, None, False, True),
    "avx-vnni": (False, True, True, None),
    "avx2": (False, True, False, True),
    "generic": (False, False, False, False),
}


def _run_variant(variant: str, tmp_path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CPU_")}
    env.update(MOETUNE_CPU_ISA=variant, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    return subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "out.pt")], env=env, capture_output=True,
                          text=True, timeout=900)


@pytest.fixture(scope="module")
def variant_runs(tmp_path_factory) -> dict:
    """Every variant this host runs, each in its own process, two at a time (each compiles on one core):
    variant → (its process, its directory). Each test below reads its own variant's outcome."""
    root = tmp_path_factory.mktemp("isa")
    dirs = {v: root / v for v in isa.host_variants() if v in isa.VARIANTS}
    for d in dirs.values():
        d.mkdir()
    with ThreadPoolExecutor(2) as pool:
        futures = {v: pool.submit(_run_variant, v, d) for v, d in dirs.items()}
    return {v: (f.result(), dirs[v]) for v, f in futures.items()}


LLAMA = (1, 1, True, True)  # (Q4_X_PARTS_FEW, Q4_X_PARTS, Q4_SCALE_FP16_FEW, Q4_SCALE_FP16)
DEFAULT = (2, 3, True, False)


@contextmanager
def _mode(interleaved: bool, mode: tuple) -> Iterator[None]:
    """The int4 switches set to `mode` (the twins follow them), restored after."""
    names = ("Q4_INTERLEAVED", "Q4_X_PARTS_FEW", "Q4_X_PARTS", "Q4_SCALE_FP16_FEW", "Q4_SCALE_FP16")
    old = [getattr(runtime, n) for n in names]
    for n, v in zip(names, (interleaved, *mode)):
        setattr(runtime, n, v)
    try:
        yield
    finally:
        for n, v in zip(names, old):
            setattr(runtime, n, v)


def _twin_close(got, x, w, interleaved: bool = True, mode: tuple = LLAMA) -> None:
    """got equals the integer twin up to one x element rounding the other way, and the fp32 twin
    within `q8_bound` (as tests/kernels/test_cpu_int_simd.py and test_cpu_q4r.py state it). interleaved:
    int4 on the interleaved kernels (x in int8 parts, the scales in fp16 or fp32, as `mode` gives a call
    of x's rows), else the int16 path."""
    with _mode(interleaved, mode):
        interleaved = w.fmt == WeightFormat.INT4 and interleaved
        if interleaved:
            _, xd = quantize_x_ref(x, w.group_size)  # [M, G]
            xs = xd * 127 / x_levels(w, x.shape[0])  # the last part's step
        else:
            _, xs = quantize_rows_ref(x, x_block(w))  # [M, blocks]
        step = xs.amax(dim=1)[:, None] * dequantize(w).abs().amax(dim=1)[None, :]  # [M, N]
        want = (linear_q4r_ref(x, w) if interleaved else linear_q4_ref(x, w) if w.fmt == WeightFormat.INT4
                else linear_q8_ref(x, w))
        assert ((got - want).abs() <= step + 2e-5 * want.abs().amax() + 1e-30).all()
        ref = linear_ref(x, w)
        assert ((got - ref).abs() <= q8_bound(x, w) * (1 + 1e-4) + 2e-6 * ref.abs().amax()).all()


@pytest.mark.parametrize("variant", isa.VARIANTS)
def test_each_variant_matches_the_twins(variant, request):
    if variant not in isa.host_variants():
        pytest.skip(f"this CPU cannot run {variant}")
    proc, out = request.getfixturevalue("variant_runs")[variant]
    assert proc.returncode == 0, proc.stderr
    got = torch.load(out / "out.pt", weights_only=False)  # PackedWeights: written by the test's own process
    assert got["variant"].split(" ")[0] == variant
    for want, have in zip(ASM[variant], (got["zmm"], got["ymm"], got["vnni"], got["madd"])):
        assert want is None or want == have, (variant, got)
    for want, have in zip(ASM_Q4R[variant], got["q4r"]):
        assert want is None or want == have, (variant, got["q4r"])
    assert got["q4r_prefetch"] > 0  # decode's int4 tiles request the next page of weights (`_simd_q4r.AHEAD_BYTES`)
    for (w, x), (y1, y) in zip(got["cases"], got["y"]):
        _twin_close(y1, x[:1], w)
        _twin_close(y, x, w)
    for (w, x), (y1, y) in zip(got["cases"][1:], got["y16"]):
        _twin_close(y1, x[:1], w, interleaved=False)
        _twin_close(y, x, w, interleaved=False)
    for parts in (2, 3):
        for (w, x), (y1, y) in zip(got["cases"][1:], got["parts"][parts]):
            _twin_close(y1, x[:1], w, mode=(parts, parts, False, False))
            _twin_close(y, x, w, mode=(parts, parts, False, False))
    w13, w2, off, xe, ye = got["experts"]
    ref = fused_experts_cpu_ref(xe, off, w13, w2)  # one-row experts, x and the activation in int8: < 3e-2
    assert ((ye - ref).norm() / ref.norm()).item() < 3e-2
    x17, yd, offd, xd, yde = got["default"]  # the default mode on both sides of its 16-row boundary
    for (w, _), x, (y16, y17) in zip(got["cases"][1:], x17, yd):
        _twin_close(y16, x[:16], w, mode=DEFAULT)
        _twin_close(y17, x, w, mode=DEFAULT)
    with _mode(True, DEFAULT):
        want = experts_twin(xd, offd, w13, w2)  # experts of 16 and 17 rows: fp16 scales and 2 parts, fp32 and 3
    assert ((yde - want).norm() / want.norm()).item() < 5e-5


def test_describe_names_the_choice(monkeypatch):
    monkeypatch.delenv("MOETUNE_CPU_ISA", raising=False)
    assert isa.requested() is None
    assert isa.variant_of({"avx2", "fma"}) == "avx2"
    assert isa.variant_of({"avx2", "fma", "avxvnni"}) == "avx-vnni"
    assert isa.variant_of({"avx2", "fma", "avx512f", "avx512bw", "avx512vl"}) == "avx512"
    assert isa.variant_of({"sse2"}) == "generic"
    monkeypatch.setenv("MOETUNE_CPU_ISA", "avx3")
    with pytest.raises(isa.ISAError, match="not a kernel variant"):
        isa.requested()


def test_cli_refuses_an_unknown_variant_in_one_line():
    r = moetune("bench", "--prefill-len", "16", "--decode-steps", "2", "--runs", "3",
                env={"MOETUNE_CPU_ISA": "avx1024"})
    assert_one_line_error(r, "MOETUNE_CPU_ISA", "avx1024")


def test_bench_prints_and_env_records_the_variant(tiny_bench):
    """`moetune bench` names the kernels' variant in its header; a run directory's env.json records it."""
    from moetune.profile.env import device_info

    r = tiny_bench  # `moetune bench` through the console script (tests/conftest.py: one launch, shared)
    assert r.returncode == 0, r.stderr
    assert f"CPU kernels: {isa.host_variants()[0]}" in r.stdout + r.stderr
    assert device_info(torch.device("cpu"))["kernel_isa"] == isa.describe()
