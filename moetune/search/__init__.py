"""Optuna search over deployments (EP size, quantization mix, offload depth, replication).

Not built yet; it will read run directories written by `moetune.profile` (routing traces to replay).
"""
