"""Dump vLLM's and SGLang's real command-line parsers into the flag tables moetune checks its
emitted launch commands against (`moetune/search/study/flag_tables/*.json`), or parse emitted
`winner.*.sh` files with those real parsers.

Run it in a throwaway environment that has the engines installed (their wheels without their
dependencies, plus whatever their argument modules import; CPU torch is enough):

    python3 -m venv /tmp/engines && . /tmp/engines/bin/activate
    pip install torch==2.13.0 && pip install --no-deps vllm sglang sglang-router   # then each missing import
    VLLM_TARGET_DEVICE=cpu python tools/engine_flag_tables.py dump moetune/search/study/flag_tables
    VLLM_TARGET_DEVICE=cpu python tools/engine_flag_tables.py check out/search/winner.vllm.sh ...

moetune itself never imports this file; the tables it writes are what tests/search/test_engine_flags.py
parses every emitted command with.
"""

from __future__ import annotations

import argparse
import json
import sys
import typing
from pathlib import Path


def vllm_parser() -> tuple[str, argparse.ArgumentParser]:
    import vllm
    import vllm.entrypoints.common.cli_args as cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return vllm.__version__, cli_args.make_arg_parser(FlexibleArgumentParser())


def sglang_parser() -> tuple[str, argparse.ArgumentParser]:
    import sglang
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return sglang.__version__, parser


def router_parser() -> tuple[str, argparse.ArgumentParser]:
    """SGLang's P/D router (`python -m sglang_router.launch_router`): RouterArgs' own flags."""
    import sglang_router
    from sglang_router.router_args import RouterArgs

    parser = argparse.ArgumentParser()
    RouterArgs.add_cli_args(parser)
    return getattr(sglang_router, "__version__", "unknown"), parser


def kv_transfer_table() -> dict:
    """vLLM's --kv-transfer-config JSON: KVTransferConfig's fields (a Literal's values as choices) and the
    connector names its factory registers."""
    import dataclasses

    from vllm.config.kv_transfer import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    fields = {}
    for f in dataclasses.fields(KVTransferConfig):
        args = [a for a in typing.get_args(f.type) if isinstance(a, str)] if not isinstance(f.type, str) else []
        fields[f.name] = args or None
    import vllm

    return {"engine": "vllm", "flag": "--kv-transfer-config", "version": vllm.__version__, "fields": fields,
            "connectors": sorted(KVConnectorFactory._registry)}


def _value_domains(engine: str) -> dict[str, list[str]]:
    """Flags whose parser checks the value later (a `type` function, not argparse `choices`)."""
    if engine != "vllm":
        return {}
    from vllm.config.cache import CacheDType
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS

    return {"--quantization": list(QUANTIZATION_METHODS), "--kv-cache-dtype": list(typing.get_args(CacheDType))}


def table(engine: str, version: str, parser: argparse.ArgumentParser) -> dict:
    domains = _value_domains(engine)
    flags = []
    for a in parser._actions:
        if not a.option_strings or "-h" in a.option_strings:
            continue
        choices = [str(c) for c in a.choices] if a.choices is not None else None
        choices = choices or next((domains[s] for s in a.option_strings if s in domains), None)
        row = {"names": list(a.option_strings), "value": a.nargs != 0,
               "int": a.type is int, "choices": choices,
               "deprecated": "Deprecated" in type(a).__name__ or (a.help or "").startswith("Deprecated")}
        if a.nargs not in (None, 0) and engine == "sglang_router":  # the router's --prefill URL [PORT], --decode URL
            row.update(nargs=a.nargs, append=isinstance(a, argparse._AppendAction))
        flags.append(row)
    return {"engine": engine, "version": version, "flags": flags}


def dump(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for engine, make in (("vllm", vllm_parser), ("sglang", sglang_parser), ("sglang_router", router_parser)):
        version, parser = make()
        (out / f"{engine}.json").write_text(json.dumps(table(engine, version, parser), indent=0) + "\n")
        print(f"{engine} {version}: {sum(1 for a in parser._actions if a.option_strings)} flags → {out / (engine + '.json')}")
    (out / "vllm_kv_transfer.json").write_text(json.dumps(kv_transfer_table(), indent=0) + "\n")


def check(files: list[str]) -> int:
    """Parse every command of every emitted file with the engine's real parser."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from moetune.search.study.flag_table import commands_of

    bad = 0
    for name in files:
        engine = "sglang" if "sglang" in Path(name).name else "vllm"
        _, parser = vllm_parser() if engine == "vllm" else sglang_parser()
        text = Path(name).read_text()
        router = router_parser()[1] if "sglang_router" in text else None  # a disaggregated winner's router
        for argv in commands_of(text):
            try:
                (router if router is not None and "--pd-disaggregation" in argv else parser).parse_args(argv)
                print(f"ok   {name}: {' '.join(argv[:4])} …")
            except SystemExit:
                bad += 1
                print(f"FAIL {name}: {' '.join(argv)}")
    return 1 if bad else 0


if __name__ == "__main__":
    what, *rest = sys.argv[1:] or ["help"]
    if what == "dump" and len(rest) == 1:
        dump(Path(rest[0]))
    elif what == "check" and rest:
        sys.exit(check(rest))
    else:
        print(__doc__)
