"""A Ctrl-C or SIGTERM that lands while a finalizer (`__del__`) runs still ends the command with its one
line: Python drops an exception raised in `__del__` (printing "Exception ignored in ... Traceback"), so
the funnel's handler sends the signal again a moment later instead of raising there. Seen in a test run as
a flaky tests/cli/test_bad_input.py::profile-ctrl-c (the signal landed in a regex object's `__del__`)."""

import signal
import subprocess
import sys
import textwrap

import pytest

from moetune.cli.funnel import in_finalizer

SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    import typer
    from moetune.cli.funnel import run_cli

    app = typer.Typer()

    class Holder:
        def __del__(self):
            os.kill(os.getpid(), signal.{sig})  # delivered while this finalizer runs
            time.sleep(0.2)

    @app.command()
    def work():
        Holder()  # collected at once: the signal arrives inside __del__
        time.sleep(2.0)
        print("finished")

    @app.command()
    def other():
        pass

    run_cli(app, ["work", "other"])
""")


@pytest.mark.parametrize("sig, code, line", [("SIGINT", 130, "error: interrupted; nothing was written"),
                                             ("SIGTERM", 143, "error: terminated; nothing was written")])
def test_a_signal_inside_a_finalizer_still_ends_the_run_in_one_line(sig, code, line):
    # SIGINT at its default, as in a terminal: a suite run as a background job hands its children SIGINT ignored
    r = subprocess.run([sys.executable, "-c", SCRIPT.format(sig=sig), "work"], capture_output=True, text=True,
                       timeout=60, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert r.returncode == code, r.stderr
    assert r.stderr.strip() == line and "finished" not in r.stdout


def test_in_finalizer_looks_up_the_whole_stack():
    import sys as _sys

    found = []

    def inner():
        found.append(in_finalizer(_sys._getframe()))

    class Holder:
        def __del__(self):
            inner()

    Holder()
    inner()
    assert found == [True, False]


QUICK = textwrap.dedent("""
    import os, signal
    import typer
    from moetune.cli.funnel import run_cli
    from moetune.errors import MoetuneError

    app = typer.Typer()

    class Holder:
        def __del__(self):
            os.kill(os.getpid(), signal.{sig})  # its resend is due in RESEND_S ...

    @app.command()
    def work():
        Holder()
        raise MoetuneError("the command failed first")  # ... but the command has already ended

    @app.command()
    def other():
        pass

    run_cli(app, ["work", "other"])
""")


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_resend_due_after_the_command_ended_is_dropped(sig):
    """The funnel cancels a pending resend when it restores the handlers: sent later, it met them while
    Python shut down (SIGINT: a KeyboardInterrupt traceback after the one line; SIGTERM: exit −15)."""
    r = subprocess.run([sys.executable, "-c", QUICK.format(sig=sig), "work"], capture_output=True, text=True,
                       timeout=60, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert r.stderr.strip() == "error: the command failed first"
