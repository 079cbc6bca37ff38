"""`moetune search` and `moetune simulate`: an Optuna study over the deployment knobs, evaluated by a
cost model replaying a run directory's routing trace (`simulate`) or by running the engine here
(`measure`); the winner emitted as a recipe. Only `moetune.cli` imports this package.

cost/  the cost model: simulate.py (Simulator) · schedule.py · hardware.py · simmodel.py · offload.py
       · formats.py · scale.py · source.py · memory.py · calibrate.py · metrics.py
study/ the study: space.py knobs + pruning · optuna_study.py · evaluate.py · measure.py · setup.py
       · run.py · one.py · emit.py · tables.py · report.py
The cost model sits below the study (an import-linter contract): it never imports the study.
"""
