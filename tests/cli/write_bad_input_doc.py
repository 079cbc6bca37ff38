"""Run the bad-input table through the real CLI and write docs/bad-input.md with the real messages.

    python -m tests.cli.write_bad_input_doc
"""

from __future__ import annotations

import re
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.cli.bad_input import CASES, markdown
from tests.cli.test_bad_input import WORKERS, _run
from tests.serve.bad_http_doc import SECTION as HTTP_SECTION

DOC = Path(__file__).resolve().parents[2] / "docs" / "bad-input.md"
HEADER = """# Bad input: what the `moetune` CLI says

Every row is one case of the table-driven suite (`tests/cli/bad_input.py`, run by
`tests/cli/test_bad_input.py` through the real console script in a subprocess). Each asserts the
exit code, exactly one line on stderr (no traceback), nothing on stdout and no file left behind.
Exit codes: 2 usage mistake found by typer/click, 1 user mistake found by moetune, 130 Ctrl-C,
143 SIGTERM. Messages below are the real output of the last run (temporary paths shortened to
`…/`). Regenerate: `python -m tests.cli.write_bad_input_doc`.

"""


def main() -> None:
    from moetune.config import parse_config
    from moetune.profile.runner import ProfileSettings, run_profile
    from moetune.profile.workload import Workload
    from tests.checkpoints import build_checkpoint

    root = Path(tempfile.mkdtemp(prefix="bad-input-doc-"))
    src = {"ck": build_checkpoint("qwen3_moe", root / "ck", shard=False),
           "ck6": build_checkpoint("olmoe", root / "ck6", shard=False),
           "sharded": build_checkpoint("olmoe", root / "sharded", shard=True)}
    work = Workload(num_requests=2, batch_size=2, input_len=8, output_len=2, warmup_steps=0)
    src["run"] = run_profile(ProfileSettings(parse_config({"model": {"path": str(src["ck"])}}), work,
                                             out=root / "run")).path
    with ThreadPoolExecutor(WORKERS) as pool:
        futures = {c.id: pool.submit(_run, c, root / "cases" / c.id, src) for c in CASES}
    results = {}
    for cid, future in futures.items():
        got = future.result()
        line = got.stderr.strip().splitlines()[0] if got.stderr.strip() else ""
        results[cid] = (got.code, re.sub(re.escape(str(root)) + r"/(cases/[^/ ']+/)?", "…/", line))
    DOC.parent.mkdir(exist_ok=True)
    DOC.write_text(HEADER + markdown(results) + HTTP_SECTION)
    print(f"wrote {DOC} ({len(CASES)} cases)")


if __name__ == "__main__":
    main()
