"""Runs on R expert-parallel ranks for real: each rank's RankProfiler, the merge on rank 0, the measured
rank tables and the per-rank summary. Below the package's public face (runner, analysis): it imports
the shared helpers, never the other way round."""
