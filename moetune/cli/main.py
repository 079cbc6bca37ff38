"""The `moetune` command: a table of contents of subcommands, each in its own module.

User mistakes (`MoetuneError`) print one line on stderr and exit 1; nothing else is swallowed.
"""

from __future__ import annotations

import sys

import typer

from moetune.cli.bench import bench
from moetune.cli.generate import generate
from moetune.cli.models import models
from moetune.cli.placement import placement
from moetune.cli.profile import profile
from moetune.cli.report import report
from moetune.cli.tune_kernels import tune_kernels

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


def main() -> None:
    from moetune.errors import MoetuneError

    try:
        app(standalone_mode=False)
    except MoetuneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
    except (typer.Abort, KeyboardInterrupt):
        print("aborted", file=sys.stderr)
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except Exception as exc:  # click usage errors arrive here in non-standalone mode
        import click

        if isinstance(exc, click.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        raise
