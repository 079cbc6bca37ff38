"""What the serve tests share about an OpenAI-style error answer and the server's log while a test runs."""

import logging

import httpx
import pytest


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    err = response.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


@pytest.fixture
def logged():
    """Log records of uvicorn and moetune while the test runs (the server runs in this process)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    loggers = [logging.getLogger(n) for n in ("uvicorn", "uvicorn.error", "moetune")]
    for lg in loggers:
        lg.addHandler(handler)
    yield records
    for lg in loggers:
        lg.removeHandler(handler)
