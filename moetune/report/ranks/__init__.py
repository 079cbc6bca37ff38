"""Report pieces of runs on R ranks: the measured per-rank tables and the per-rank timeline."""
