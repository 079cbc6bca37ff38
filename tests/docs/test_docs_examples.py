"""Every runnable block of the README and docs/*.md runs as written (tests/docs/blocks.py says how:
one directory per document, in order, through the installed `moetune`), so an example that stops
working fails CI. Blocks that need a GPU or a cluster say so in the markdown and are skipped here."""

from pathlib import Path

import pytest

from tests.docs.blocks import Runner, extract

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCKS = [b for doc in DOCS for b in extract(doc.read_text(), doc.relative_to(ROOT).as_posix())]


@pytest.fixture(scope="module")
def runners(tmp_path_factory):
    """One Runner per document, in a fresh directory holding what a clone has beside the docs (recipes/)."""
    made: dict[str, Runner] = {}

    def get(doc: str) -> Runner:
        if doc not in made:
            for other in list(made.values()):  # one document's servers at a time
                other.close()
            cwd = tmp_path_factory.mktemp(doc.replace("/", "_").replace(".", "_"))
            (cwd / "recipes").symlink_to(ROOT / "recipes")
            made[doc] = Runner(cwd)
        return made[doc]

    yield get
    for runner in made.values():
        runner.close()


def test_the_readme_has_runnable_blocks_and_every_skip_says_why():
    readme = [b for b in BLOCKS if b.doc == "README.md"]
    assert sum(b.mode != "skip" for b in readme) >= 9
    assert all(b.reason for b in readme if b.mode == "skip")


@pytest.mark.slow
@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_block_runs(block, runners):
    if block.mode == "skip":
        pytest.skip(block.reason)
    outcome = runners(block.doc).run(block)
    assert outcome.ok, f"{block.id} ({block.section}) exited {outcome.returncode}:\n{outcome.output[-4000:]}"
