"""Re-measuring the top K (`--remeasure N`, `--remeasure-on ENGINE K`) measures the best K trials that can
run there: a better-ranked trial the engine cannot run (no flag for a knob, more ranks than its CPU build
takes) is listed with why, and the next runnable one is measured in its place."""

from types import SimpleNamespace

from moetune.search.study.run import runnable_top
from moetune.search.study.tables import remeasure_table


def _rows(ep_sizes):
    return [SimpleNamespace(number=i, deployment=SimpleNamespace(ep=ep), metrics={}) for i, ep in enumerate(ep_sizes)]


def _one_rank(d):
    return None if d.ep == 1 else f"one rank here (this point has {d.ep})"


def test_the_best_runnable_trials_are_taken_and_the_better_ranked_others_say_why():
    rows = _rows([2, 2, 1, 2, 1, 1])
    take, refused = runnable_top(rows, 2, _one_rank)
    assert [r.number for r in take] == [2, 4]
    assert [(r.number, why) for r, why in refused] == [(0, "one rank here (this point has 2)"),
                                                        (1, "one rank here (this point has 2)"),
                                                        (3, "one rank here (this point has 2)")]


def test_fewer_runnable_trials_than_k_take_them_all_and_stop_at_the_end():
    take, refused = runnable_top(_rows([2, 1, 2]), 5, _one_rank)
    assert [r.number for r in take] == [1] and [r.number for r, _ in refused] == [0, 2]
    take, refused = runnable_top(_rows([1, 1, 1]), 0, _one_rank)
    assert take == [] and refused == []


def test_the_table_names_where_and_marks_a_trial_not_run_apart_from_a_failure():
    from moetune.search.cost.deployment import Deployment

    d = Deployment()
    row = SimpleNamespace(number=7, deployment=d, metrics={"output_tok_s": 900.0})
    t = remeasure_table([(row, None, "not run: vllm has no flag for: x"), (row, None, "RuntimeError: boom")], "vllm")
    assert t.title == "Top trials re-measured on vllm: estimated vs measured"
    assert [r[3] for r in t.rows] == ["not run", "failed"]
