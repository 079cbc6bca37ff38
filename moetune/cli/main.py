"""The `moetune` command: a table of contents of subcommands, each in its own module.

Every failure goes through one funnel (`cli/funnel.py`): one line on stderr and an exit code
(2 usage, 1 user mistake, 130 Ctrl-C, 143 SIGTERM); bugs keep their traceback.
"""

from __future__ import annotations

import gc
import sys

import typer

from moetune.cli.bench import bench
from moetune.cli.bench_serve import bench_serve
from moetune.cli.eval import eval_command
from moetune.cli.generate import generate
from moetune.cli.models import models
from moetune.cli.placement import placement
from moetune.cli.profile import profile
from moetune.cli.quantize import quantize
from moetune.cli.report import report
from moetune.cli.search import search
from moetune.cli.serve import serve
from moetune.cli.simulate import simulate
from moetune.cli.tune_kernels import tune_kernels

COMMANDS = ["generate", "bench", "models", "profile", "placement", "report", "tune-kernels", "serve", "bench-serve",
            "quantize", "eval", "search", "simulate"]  # every command below, in order (tests/test_structure.py)

app = typer.Typer(
    help="Profile, tune and serve Mixture-of-Experts models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command()(generate)
app.command()(bench)
app.command()(models)
app.command()(profile)
app.command()(placement)
app.command()(report)
app.command(name="tune-kernels")(tune_kernels)
app.command()(serve)
app.command(name="bench-serve")(bench_serve)
app.command()(quantize)
app.command(name="eval")(eval_command)
app.command()(search)
app.command()(simulate)


def main() -> None:
    from moetune.cli.funnel import run_cli
    from moetune.engine.heap import keep_freed_memory
    from moetune.engine.threads import choose_wait_policy

    command = next((a for a in sys.argv[1:] if not a.startswith("-")), "")
    serving = command == "serve" and "--help" not in sys.argv  # (a server reads the load for ~1 s)
    choose_wait_policy(server=serving)  # before torch loads its OpenMP runtime (docs/cpu.md)
    keep_freed_memory()  # before the first big tensor (engine/heap.py)

    try:
        run_cli(app, COMMANDS)
    finally:
        # the command is done (its `with` blocks closed): the interpreter's exit skips walking every
        # object torch made for a last cyclic collection, some 0.2 s a run; atexit hooks still run
        gc.freeze()
