"""Every trial that did not end feasible says why in trials.csv (pruned, failed, over a limit), a
trial that ran as its canonical twin says so, and the tables and the CSV name each trial by the
deployment it ran: what the winner's recipe says."""

import csv

import yaml

from tests.cli_run import moetune

SPACE = """ep_size: [1, 2, 3]
redundant_experts: [0, 1]
offload_resident_fraction: [1.0, 0.5]
max_num_seqs: [8, 256]
replicas: [1]
attn_dp: 0
moe_a2a: 1
expert_tp_size: 1
"""


def _search(run_dir, tmp_path, name, *extra):
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    out = tmp_path / name
    r = moetune("search", "--trace", str(run_dir), "--hardware", "H100", "--sampler", "grid", "--n-trials", "24",
                "--space", str(space), "--out", str(out), *extra)
    assert r.returncode == 0, r.stderr
    with (out / "trials.csv").open() as f:
        return out, list(csv.DictReader(f)), r


def test_every_trial_that_is_not_a_feasible_result_has_its_reason(run_dir, tmp_path):
    out, rows, _ = _search(run_dir, tmp_path, "open")
    assert len(rows) == 24
    for row in rows:
        if row["state"] != "COMPLETE" or row["feasible"] != "True":
            assert row["reason"], row
    offload_r2 = [r for r in rows if r["ep_size"] == "2" and r["redundant_experts"] == "0"
                  and float(r["offload_resident_fraction"]) < 1]
    assert offload_r2 and all("offloading at ep_size 2 → every expert resident" in r["reason"]
                              and "resident=" not in r["deployment"] for r in offload_r2)  # repaired: it ran all resident
    not_dividing = [r for r in rows if r["ep_size"] == "3"]
    assert all("slots tile 3 ranks" in r["reason"] for r in not_dividing)  # N rounded up until they do
    moot = [r for r in rows if r["ep_size"] == "1" and r["redundant_experts"] == "1" and r["state"] == "COMPLETE"]
    assert moot and all("replicas and placement change nothing" in r["reason"] for r in moot)
    assert all(" N=0 " in r["deployment"] for r in moot)  # the deployment it ran, not the one asked


def test_the_winner_row_names_the_deployment_its_recipe_says(run_dir, tmp_path):
    out, rows, _ = _search(run_dir, tmp_path, "win")
    recipe = yaml.safe_load((out / "winner.yaml").read_text())
    winner = next(r for r in rows if r["trial"] == str(recipe_trial(out)))
    p, e = recipe["parallel"], recipe["engine"]
    label = winner["deployment"]
    assert f"R={p['ep_size']} N={p['redundant_experts']} {p['placement']}" in label
    assert f"seqs={e['max_num_seqs']} " in label
    assert (out / "winner.yaml").read_text().splitlines()[0].endswith(f"): {label}")  # the recipe's own label


def test_a_limit_no_trial_meets_is_each_trials_reason(run_dir, tmp_path):
    _, rows, result = _search(run_dir, tmp_path, "tight", "--max-ttft-ms", "0.0001")
    done = [r for r in rows if r["state"] == "COMPLETE"]
    assert done and all(r["feasible"] == "False" and "over --max-ttft-ms 0.0001" in r["reason"] for r in done)
    assert "no feasible trial" in result.stdout


def recipe_trial(out) -> int:
    """The winner's trial number, from the comment winner.yaml starts with."""
    import re

    head = (out / "winner.yaml").read_text()
    return int(re.search(r"trial (\d+)", head).group(1))
