"""`moetune search` and `moetune simulate`: an Optuna study over the deployment knobs, evaluated by a
cost model replaying a run directory's routing trace (`simulate`) or by running the engine here
(`measure`); the winner emitted as a recipe. Only `moetune.cli` imports this package.

space.py knobs + pruning · hardware.py · simmodel.py · schedule.py · offload.py · formats.py · scale.py
· source.py · memory.py · calibrate.py · simulate.py · measure.py · evaluate.py · study.py · setup.py
· run.py · one.py · emit.py · tables.py · report.py · metrics.py
"""
