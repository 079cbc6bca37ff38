"""User-facing errors: one line that says what is wrong and what to do.

The CLI catches `MoetuneError` and prints its message without a traceback; anything else is a bug
and keeps its traceback.
"""


class MoetuneError(Exception):
    """A mistake in the user's input (path, config, recipe, request), not a bug in moetune."""


class CheckpointError(MoetuneError):
    """The model directory cannot be loaded as asked."""


class RecipeError(MoetuneError):
    """A recipe key, type or value is wrong."""


class RequestError(MoetuneError):
    """A generation request cannot be served (e.g. longer than the context)."""
