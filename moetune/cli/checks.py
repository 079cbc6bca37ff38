"""Argument checks run before any model is loaded: each refusal is a `UsageError` naming the flag.

Numbers must be finite and in range, devices known, text encodable as UTF-8, output paths
creatable (probed by creating and removing a temporary entry), and a workload must fit the
model's context and, by an estimate shown with its numbers, the machine's memory.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from pathlib import Path

from moetune.errors import RecipeError, UsageError

GB = 1e9


# --- numbers and text --------------------------------------------------------------------------

def number(flag: str, value: float | int | None, low: float | None = None, high: float | None = None,
           low_open: bool = False) -> None:
    """`value` finite and within [low, high] (or (low, high] with low_open); None passes."""
    if value is None:
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise UsageError(f"{flag} {value} is not a finite number")
    if low is not None and (value <= low if low_open else value < low):
        raise UsageError(f"{flag} {value} must be {'>' if low_open else '>='} {low:g}")
    if high is not None and value > high:
        raise UsageError(f"{flag} {value} must be <= {high:g}")


def sampling(max_tokens: int, temperature: float, top_p: float, top_k: int, seed: int | None) -> None:
    number("--max-tokens", max_tokens, 1)
    number("--temperature", temperature, 0)
    number("--top-p", top_p, 0, 1, low_open=True)
    number("--top-k", top_k, 0)
    number("--seed", seed, 0, 2**63 - 1)


def text(flag: str, value: str) -> None:
    """The text must encode as UTF-8: undecodable argv bytes arrive as lone surrogates."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = value[exc.start]
        raw = f"byte 0x{ord(bad) - 0xDC00:02x}" if 0xDC80 <= ord(bad) <= 0xDCFF else f"lone surrogate U+{ord(bad):04X}"
        raise UsageError(f"{flag} is not valid UTF-8 text ({raw} at character {exc.start}); "
                         "pass UTF-8 encoded text") from None


def recipe_file(path: str) -> None:
    """A recipe that is a readable UTF-8 file (its YAML and keys are judged by `load_recipe`)."""
    p = Path(path)
    if p.is_dir():
        raise RecipeError(f"recipe '{p}' is a directory; pass a YAML file (recipes/*.yaml)")
    if not p.exists():
        return  # load_recipe says so
    try:
        p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecipeError(f"recipe '{p}' is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                          f"{exc.start})") from None
    except OSError as exc:
        raise RecipeError(f"cannot read recipe '{p}': {exc.strerror}") from None


def quant_formats(quant) -> None:
    """The recipe's quant format names, before anything loads (torch-free)."""
    if quant is None:
        return
    from moetune.quant.names import QuantError, parse_dense, parse_name

    for key in ("experts", "high", "low", "dense"):
        name = getattr(quant, key)
        if name is not None:
            try:
                (parse_dense if key == "dense" else parse_name)(name)
            except QuantError as exc:
                raise RecipeError(f"quant.{key}: {exc}") from None


# --- devices -----------------------------------------------------------------------------------

_DEVICE = re.compile(r"^(auto|cpu|cuda|cuda:\d+|mps)$")


def device(name: str) -> None:
    """auto | cpu | cuda | cuda:N (N below the device count) | mps where present."""
    hint = "use auto, cpu, cuda or cuda:N"
    if name == "meta":
        raise UsageError(f"device 'meta' holds no data and cannot run a model; {hint}")
    if not _DEVICE.match(name):
        raise UsageError(f"device '{name}' is not known; {hint}")
    if name.startswith("cuda"):
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise UsageError(f"device '{name}' requested but no CUDA device is available; use --device cpu")
        index = int(name.split(":")[1]) if ":" in name else 0
        if index >= count:
            raise UsageError(f"device '{name}' does not exist: this machine has {count} CUDA device(s), "
                             f"cuda:0..cuda:{count - 1}")
    if name == "mps":
        import torch

        if not torch.backends.mps.is_available():
            raise UsageError(f"device 'mps' is not available on this machine; {hint}")


# --- output paths ------------------------------------------------------------------------------

def _existing_ancestor(path: Path) -> Path:
    path = path.absolute()
    while not path.exists():
        path = path.parent
    return path


def _probe(directory: Path, flag: str, shown: Path) -> None:
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".moetune-probe-", dir=directory))
    except OSError as exc:
        raise UsageError(f"{flag} '{shown}': cannot create anything in '{directory}' "
                         f"({exc.strerror or exc})") from None


def output_dir(flag: str, path: Path) -> None:
    """A directory that exists (and is a directory) or can be created, with room to write in it."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} '{path}' is an existing file, not a directory")
    anchor = _existing_ancestor(path)
    if not anchor.is_dir():
        raise UsageError(f"{flag} '{path}' cannot be created: '{anchor}' is a file, not a directory")
    _probe(anchor, flag, path)


def output_file(flag: str, path: Path) -> None:
    """A file path whose directory exists and is writable; not a directory itself."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{flag} '{path}' is a directory; give a file name")
    parent = path.absolute().parent
    if not parent.is_dir():
        anchor = _existing_ancestor(parent)
        what = "is a file, not a directory" if not anchor.is_dir() else "does not exist"
        raise UsageError(f"{flag} '{path}': directory '{parent if anchor.is_dir() else anchor}' {what}")
    _probe(parent, flag, path)


# --- context and memory ------------------------------------------------------------------------

def context(flag: str, tokens: int, max_len: int, hint: str, words: str = "the model's context") -> None:
    """`tokens` positions within a context of max_len (`words` names it: engine/limits.py's context_words)."""
    if tokens > max_len:
        raise UsageError(f"{flag} needs {tokens} positions but {words} is {max_len}; {hint}")


def available_memory(dev) -> tuple[int, str]:
    """Bytes free for a new allocation on `dev` (torch.device; None = host memory) and its name."""
    if dev is not None and dev.type == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info(dev.index or 0)
        return int(free), f"{dev} has {free / GB:.1f} GB free"
    return _host_available(), f"this machine has {_host_available() / GB:.1f} GB of memory available"


def _host_available() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62  # unknown: do not refuse


def fits(what: str, parts: dict[str, int], dev, hint: str) -> None:
    """Refuse when the estimated bytes of `parts` exceed what `dev` has, showing every part."""
    need = sum(parts.values())
    have, where = available_memory(dev)
    if need > have:
        detail = ", ".join(f"{k} {v / GB:.1f} GB" for k, v in parts.items() if v)
        raise UsageError(f"{what} needs about {need / GB:.1f} GB ({detail}; estimate) but {where}; {hint}")
