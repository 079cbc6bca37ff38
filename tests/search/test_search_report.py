"""The search report says plainly how the winner stands against the baseline: it is the baseline, it
beats it on the first objective, or it does not (and why that can be); each figure is marked better or
worse; the Pareto plot's axes are named, not raw column names."""

from moetune.search.cost.metrics import Metrics
from moetune.search.study.report import LABELS, verdict, why_it_wins


def metrics(tok_s: float, ttft: float = 100.0, tpot: float = 10.0, mem: float = 1.0) -> Metrics:
    return Metrics(False, 0.0, 0.0, tok_s, tok_s, ttft, tpot, mem, 1)


def test_the_winner_that_is_the_baseline_is_called_so():
    line = verdict(metrics(500), metrics(500), "throughput", "R=1 seqs=16", "R=1 seqs=16")
    assert line.startswith("The winner is the baseline deployment (R=1 seqs=16)")


def test_a_winner_that_beats_the_baseline_says_by_how_much():
    line = verdict(metrics(600), metrics(400), "throughput", "R=2", "R=1")
    assert "beats the baseline (R=1) on output tokens/s: 600 vs 400 (1.50×)" in line


def test_a_winner_that_loses_to_the_baseline_says_so_and_why_that_can_be():
    line = verdict(metrics(377), metrics(487), "throughput", "seqs=8", "seqs=16")
    assert "does not beat the baseline (seqs=16) on output tokens/s: 377 vs 487" in line and "--space" in line
    # on a minimised objective lower is the win
    assert "beats" in verdict(metrics(1, tpot=5), metrics(1, tpot=9), "tpot", "a", "b").split(":")[0]


def test_a_baseline_that_could_not_run_is_not_compared_with_the_winner_itself():
    assert "could not run here" in verdict(metrics(600), None, "throughput", "R=2", "R=1")


def test_every_figure_is_marked_better_or_worse_for_the_winner():
    lines = why_it_wins(metrics(377, ttft=877, tpot=10.8, mem=0.06), metrics(487, ttft=702, tpot=11.2, mem=0.14))
    text = " ".join(lines)
    assert "487.1" not in text and "tokens/s (worse)" in text and "ms (worse), TPOT" in text
    assert "TPOT 10.8 vs 11.2 ms (better)" in text and "GB (better)" in text


def test_the_plot_labels_name_every_objective():
    from moetune.search.cost.metrics import OBJECTIVES

    assert {key for key, _ in OBJECTIVES.values()} <= set(LABELS)
