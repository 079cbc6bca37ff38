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
