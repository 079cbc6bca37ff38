"""Request bodies, parsed defensively: JSON with bounded nesting and integer size, valid Unicode only,
then the pydantic model of protocol.py; every mistake is a 400 naming its limit.

Python's json module recurses once per nesting level and converts integers digit by digit, so a
body nested 100,000 lists deep or holding an integer of 5,000 digits used to end in a
RecursionError or ValueError (500). The depth is measured before parsing, in C-speed passes (one
regex blanks the strings, numpy sums the brackets); integers are bounded by `parse_int`.

Every string of a body reaches the tokenizer (prompt, chat content, stop strings), so the body is
checked to be Unicode text once, here: the bytes must be UTF-8 (RFC 8259), decoded strictly, so a
lone UTF-16 surrogate sent as raw bytes (ED A0 80) is refused — `json.loads(bytes)` would have let
it through (it decodes with surrogatepass) — and so is one sent as an escape (`"\\ud800"`), which is
valid JSON but not text the tokenizer can encode.
"""

from __future__ import annotations

import json
import re

import numpy as np
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request

from moetune.serve.protocol import APIError
from moetune.serve.validation import validation_message

MAX_DEPTH = 32  # nesting of arrays/objects (a chat body with content parts is 5 deep)
MAX_INT_DIGITS = 40  # a signed 64-bit integer has 19; more is never a valid parameter

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class ClientGone(Exception):
    """The client disconnected before its body arrived: nobody to answer (no traceback, no response)."""


async def parse(request: Request, model: type[BaseModel], optional: bool = False) -> BaseModel:
    """The request's JSON body as `model` (an empty body is `model()` when optional)."""
    try:
        raw = await request.body()
    except ClientDisconnect:
        raise ClientGone() from None
    if optional and not raw.strip():
        return model()
    data = read_json(raw)
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        message, param = validation_message(exc.errors())
        raise APIError(400, message, param=param) from None


def read_json(raw: bytes) -> object:
    check_depth(raw)
    text = decode_utf8(raw)
    try:
        data = json.loads(text, parse_int=_bounded_int)
    except json.JSONDecodeError:
        raise APIError(400, "the request body is not valid JSON") from None
    except RecursionError:  # unreachable below MAX_DEPTH; kept so that it can never be a 500
        raise APIError(400, f"the request body nests deeper than {MAX_DEPTH} levels") from None
    if _SURROGATE_ESCAPE.search(raw):
        _check_unicode(data)
    return data


def check_depth(raw: bytes) -> None:
    """400 when arrays/objects nest deeper than MAX_DEPTH (brackets inside strings do not count)."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH:
        return  # cannot be deeper
    text = np.frombuffer(_STRING.sub(b'""', raw), np.uint8)
    step = ((text == ord("[")) | (text == ord("{"))).astype(np.int32)  # [bytes] +1 opens, -1 closes
    step -= (text == ord("]")) | (text == ord("}"))
    if step.size and int(np.cumsum(step).max()) > MAX_DEPTH:
        raise APIError(400, f"the request body nests deeper than {MAX_DEPTH} levels of arrays/objects")


def decode_utf8(raw: bytes) -> str:
    """The body as text: strict UTF-8 (a leading byte-order mark is dropped); else 400 naming the byte."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        bad = raw[exc.start : exc.start + 3]
        if len(bad) == 3 and bad[0] == 0xED and 0xA0 <= bad[1] <= 0xBF:  # U+D800..U+DFFF as 3 UTF-8 bytes
            point = (bad[0] & 0x0F) << 12 | (bad[1] & 0x3F) << 6 | bad[2] & 0x3F
            what = f"a UTF-16 surrogate (U+{point:04X}) encoded as UTF-8 bytes"
        else:
            what = f"the byte 0x{raw[exc.start]:02X}, which is not valid UTF-8,"
        raise APIError(400, f"the request body holds {what} at byte {exc.start}; JSON bodies must be valid "
                       "UTF-8 text") from None


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise APIError(400, f"the request body holds an integer of {len(digits)} digits; integers are limited "
                       f"to {MAX_INT_DIGITS} digits")
    return int(digits)


def _check_unicode(data: object) -> None:
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        char = exc.object[exc.start : exc.start + 1]
        raise APIError(400, f"the request body holds a lone UTF-16 surrogate (\\u{ord(char):04x}) in a string; "
                       "send valid Unicode text") from None
