"""Moved to tests/serve/conftest.py (ServeProcess and its helpers); these names stay importable for the
branches written against this module until they are merged. New tests import from conftest."""

from tests.serve.conftest import AUTH, ServeProcess, alive, children, metric, wait_for  # noqa: F401

RankServer = ServeProcess
