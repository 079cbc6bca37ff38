"""The cost model: a deployment priced on a hardware description by replaying a run's routing trace
(simulator, schedule, hardware, formats, memory, scale, offload, calibration). Knows nothing of Optuna."""
