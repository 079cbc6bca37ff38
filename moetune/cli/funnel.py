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
temporary files on the way out. A signal that arrives while a finalizer (`__del__`) runs is sent again a
moment later instead: Python prints an exception raised there as "Exception ignored in ..." with its
traceback and drops it, so the run would go on. Anything else is a bug in moetune and keeps its traceback.

typer bundles its own copy of click (`typer._click`); its exceptions are not subclasses of the
installed `click` package's, so both are matched here.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
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


RESEND_S = 0.05  # a signal that landed in a finalizer is sent again after this long


def in_finalizer(frame) -> bool:
    """Whether `frame` (where a signal landed) runs inside a `__del__`, whose exceptions Python drops."""
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def raising(exc_type: type[BaseException], resends: list[threading.Timer]) -> Callable:
    """A signal handler that raises `exc_type`, or sends the signal again shortly when it landed in a
    finalizer (the timer kept in `resends`, so the caller can cancel it once its handlers are gone)."""
    def handler(signum, frame) -> None:
        if in_finalizer(frame):
            timer = threading.Timer(RESEND_S, os.kill, (os.getpid(), signum))
            timer.daemon = True
            resends.append(timer)
            timer.start()
            return
        raise exc_type()
    return handler


def run_cli(app: Callable, commands: list[str]) -> None:
    """Run the typer `app` non-standalone and funnel every failure into one line + exit code."""
    if not sys.argv[1:]:
        fail(f"no command given; choose one of: {', '.join(commands)} (see 'moetune --help')", EXIT_USAGE)
    click_errors = _click_exception_types()
    resends: list[threading.Timer] = []
    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, raising(Terminated, resends))}
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where the shell made it ignored
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, raising(KeyboardInterrupt, resends))
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
        for timer in resends:  # a resend after this would meet the restored handlers at shutdown, after the
            timer.cancel()  # one line: SIGINT a KeyboardInterrupt traceback, SIGTERM an exit by the signal (−15)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if code == EXIT_INTERRUPT:  # typer turns KeyboardInterrupt into Exit(130) and returns the code
        fail("interrupted; nothing was written", EXIT_INTERRUPT)
    sys.exit(code if isinstance(code, int) else 0)
