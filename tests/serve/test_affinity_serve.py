"""`moetune serve` with engine.scheduling affinity answers concurrent greedy requests with the text
the FCFS server gives."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.serve.conftest import start_server

PROMPTS = ["import os\n", "The river was cold and", "def read(path):\n", "Once upon a time", "class Point:\n",
           "She opened the letter and"]


@pytest.fixture(scope="module")
def affinity_server():
    running, stop = start_server({"engine": {"max_num_seqs": 2, "scheduling": "affinity", "affinity_max_wait": 4}})
    yield running
    stop()


def _texts(server) -> list[str]:
    client = server.client()

    def one(prompt):
        return client.completions.create(model=server.model, prompt=prompt, max_tokens=8, temperature=0).choices[0].text

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        return list(pool.map(one, PROMPTS))


def test_affinity_serves_the_texts_of_fcfs(server, affinity_server):
    assert affinity_server.state.generator.engine.config.scheduling == "affinity"
    assert _texts(affinity_server) == _texts(server)
