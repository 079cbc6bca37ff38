"""`moetune serve` mistakes are one line on stderr, before any model is loaded."""

import socket

from tests.cli_run import assert_one_line_error, moetune


def test_a_taken_port_is_a_one_line_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        result = moetune("serve", "--port", str(s.getsockname()[1]))
    assert_one_line_error(result, "cannot listen", "--port")


def test_bad_serve_flags_name_the_key():
    assert_one_line_error(moetune("serve", "--port", "99999"), "serve.port")
    assert_one_line_error(moetune("serve", "--max-num-seqs", "0"), "engine.max_num_seqs")


def test_the_api_key_comes_from_the_flag_or_the_named_environment_variable(monkeypatch):
    import pytest

    from moetune.config import parse_config
    from moetune.errors import MoetuneError
    from moetune.serve.server import resolve_api_key

    cfg = parse_config({"serve": {"api_key_env": "MOETUNE_TEST_KEY"}})
    monkeypatch.delenv("MOETUNE_TEST_KEY", raising=False)
    with pytest.raises(MoetuneError, match="MOETUNE_TEST_KEY"):
        resolve_api_key(cfg, None)
    monkeypatch.setenv("MOETUNE_TEST_KEY", "sk-env")
    assert resolve_api_key(cfg, None) == "sk-env" and resolve_api_key(cfg, "sk-flag") == "sk-flag"
    assert resolve_api_key(parse_config({}), None) is None
