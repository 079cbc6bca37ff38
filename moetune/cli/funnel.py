"""The one error funnel of the `moetune` command.

Every way a run can end that is not success turns into exactly one line on stderr and an exit code:

| cause | exit | line |
|---|---|---|
| usage mistake found by typer/click (bad flag value, unknown flag or command, missing option) | 2 | `error: <what> (see 'moetune CMD --help')` |
| `MoetuneError` (a user mistake found by moetune) | 1 | `error: <message>` |
| an OS error reading or writing a user path (permission, disk full) | 1 | `error: <strerror>: <path>` |
| Ctrl-C (SIGINT) | 130 | `error: interrupted; nothing was written` |
| SIGTERM | 143 | `error: terminated; nothing was written` |

Interrupts unwind as exceptions, so every `with RunDirWriter(...)` and atomic writer removes its
temporary files on the way out. Anything else is a bug in moetune and keeps its traceback.

typer bundles its own copy of click (`typer._click`); its exceptions are not subclasses of the
installed `click` package's, so both are matched here.
"""

from __future__ import annotations

import signal
import sys
from typing import Callable

from moetune.errors import MoetuneError, Terminated

EXIT_USAGE = 2
EXIT_INTERRUPT = 130  # 128 + SIGINT
EXIT_TERMINATED = 143  # 128 + SIGTERM


def _click_exception_types() -> tuple[type, ...]:
    """ClickException classes of the click typer really uses (bundled or installed)."""
    types: list[type] = []
    try:
        from typer._click.exceptions import ClickException as Bundled

        types.append(Bundled)
    except ImportError:  # older typer: uses the installed click
        pass
    try:
        from click.exceptions import ClickException as Installed

        types.append(Installed)
    except ImportError:
        pass
    return tuple(types)


def _abort_types() -> tuple[type, ...]:
    import typer

    types: list[type] = [typer.Abort]
    try:
        from click.exceptions import Abort

        types.append(Abort)
    except ImportError:
        pass
    return tuple(types)


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def fail(message: str, code: int) -> None:
    sys.stderr.write(f"error: {one_line(message)}\n")
    sys.stderr.flush()
    sys.exit(code)


def usage_message(exc, commands: list[str]) -> str:
    """A click/typer usage error as one line naming the flag, with where to find help."""
    ctx = getattr(exc, "ctx", None)
    if type(exc).__name__ == "NoArgsIsHelpError":
        path = ctx.command_path if ctx is not None else "moetune"
        if ctx is not None and ctx.parent is None:
            return f"no command given; choose one of: {', '.join(commands)} (see '{path} --help')"
        return f"'{path}' needs arguments (see '{path} --help')"
    text = exc.format_message()
    path = ctx.command_path if ctx is not None else "moetune"
    return f"{text} (see '{path} --help')"


def _on_sigterm(signum, frame) -> None:
    raise Terminated()


def run_cli(app: Callable, commands: list[str]) -> None:
    """Run the typer `app` non-standalone and funnel every failure into one line + exit code."""
    if not sys.argv[1:]:
        fail(f"no command given; choose one of: {', '.join(commands)} (see 'moetune --help')", EXIT_USAGE)
    click_errors = _click_exception_types()
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        code = app(standalone_mode=False, prog_name="moetune")
    except MoetuneError as exc:
        fail(str(exc), 1)
    except Terminated:
        fail("terminated; nothing was written", EXIT_TERMINATED)
    except KeyboardInterrupt:
        fail("interrupted; nothing was written", EXIT_INTERRUPT)
    except click_errors as exc:
        fail(usage_message(exc, commands), getattr(exc, "exit_code", EXIT_USAGE))
    except _abort_types():
        fail("aborted", 1)
    except OSError as exc:
        where = exc.filename if exc.filename is not None else ""
        fail(f"{exc.strerror or exc}{': ' + str(where) if where else ''}", 1)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if code == EXIT_INTERRUPT:  # typer turns KeyboardInterrupt into Exit(130) and returns the code
        fail("interrupted; nothing was written", EXIT_INTERRUPT)
    sys.exit(code if isinstance(code, int) else 0)
