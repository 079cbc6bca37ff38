"""User-facing errors: one line that says what is wrong and what to do.

The CLI (`moetune.cli.funnel`) catches `MoetuneError` and prints its message without a traceback
(exit 1); anything else is a bug and keeps its traceback.
"""


class MoetuneError(Exception):
    """A mistake in the user's input (path, config, recipe, request), not a bug in moetune."""


class CheckpointError(MoetuneError):
    """The model directory cannot be loaded as asked."""


class RecipeError(MoetuneError):
    """A recipe key, type or value is wrong."""


class RequestError(MoetuneError):
    """A generation request cannot be served (e.g. longer than the context)."""


class UsageError(MoetuneError):
    """A flag value that cannot work (not finite, out of range, unwritable path, too large to fit)."""


class RunDirError(MoetuneError):
    """A run directory file is missing, corrupt or written by an incompatible schema version."""


class Terminated(BaseException):
    """Raised in the main thread by the SIGTERM handler, so `with` blocks and `finally` clean up.

    A BaseException (like KeyboardInterrupt) so that no `except Exception` swallows it.
    """
