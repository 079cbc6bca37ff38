"""The study: the search space, the Optuna study over it, the two evaluators (measure, simulate), and
what is written out (winner, CSVs, report). Uses the cost model below it."""
