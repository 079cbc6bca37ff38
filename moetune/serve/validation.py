"""A pydantic validation error as one line naming the parameter, in the words of OpenAI's type
errors: `'max_tokens': expected an integer, got a string ("4")`.

A union field (`prompt`, `stop`, chat `content`) fails once per member, and pydantic names the
member in the location (`prompt.list[int].1`). The member that got deepest into the value (then the
one with the fewest errors) is the one the client meant: `'prompt.1': expected an integer, got a
boolean (true)` for `[1, true]`. When every member failed at the field itself (a wrong kind of
value) their expectations are merged: `'stop': expected a string or an array, got an integer (5)`.
"""

from __future__ import annotations

import json

EXPECTED = {"int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
            "float_type": "a number", "float_parsing": "a number", "bool_type": "a boolean (true or false)",
            "bool_parsing": "a boolean (true or false)", "string_type": "a string", "list_type": "an array",
            "model_type": "an object", "model_attributes_type": "an object", "dict_type": "an object"}
_MEMBER_NAMES = frozenset({"str", "int", "float", "bool", "none"})


def validation_message(errors: list[dict]) -> tuple[str, str | None]:
    """A pydantic / FastAPI validation error → (one-line message, the offending parameter)."""
    if errors[0].get("type") == "json_invalid":
        return "the request body is not valid JSON", None
    field = _location(errors[0])[:1]
    members: dict[str | None, list[dict]] = {}  # the first field's errors by union member (None: no union)
    for err in errors:
        if _location(err)[:1] == field:
            members.setdefault(_member(err), []).append(err)
    depth = lambda e: len(_location(e))  # noqa: E731
    best = max(members.values(), key=lambda errs: (max(map(depth, errs)), -len(errs)))
    err = max(best, key=depth)  # the first of the deepest
    loc = _location(err)
    param = ".".join(str(p) for p in loc) or None
    if err.get("type") == "missing":
        return f"'{param}' is required", param
    same_place = [e for errs in members.values() for e in errs]
    if any(_location(e) != loc for e in same_place):
        same_place = [err]  # a member got further: its error alone
    kinds = [EXPECTED.get(e["type"]) for e in same_place]
    if all(kinds):
        msg = f"expected {_alternatives(list(dict.fromkeys(kinds)))}, got {json_kind(err.get('input'))}"
    else:
        msg = str(err.get("msg", "invalid request")).removeprefix("Value error, ")
    return (f"'{param}': {msg}" if param else msg), param


def _alternatives(kinds: list[str]) -> str:
    return kinds[0] if len(kinds) == 1 else ", ".join(kinds[:-1]) + " or " + kinds[-1]


def json_kind(value: object) -> str:
    """What a JSON value is, as an error names it: `a string ("4")`, `a boolean (true)`, `null`."""
    if value is None:
        return "null"
    if isinstance(value, (list, dict)):
        return "an array" if isinstance(value, list) else "an object"
    kind = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}.get(type(value), "a value")
    shown = json.dumps(value)
    return f"{kind} ({shown if len(shown) <= 40 else shown[:37] + '...'})"


def _location(error: dict) -> tuple:
    """The error's location without "body" and without the names pydantic gives union members."""
    return tuple(p for p in error.get("loc", ()) if p != "body" and not _member_name(p))


def _member(error: dict) -> str | None:
    return next((p for p in error.get("loc", ()) if _member_name(p)), None)


def _member_name(part: object) -> bool:
    return isinstance(part, str) and (part in _MEMBER_NAMES or "[" in part)
