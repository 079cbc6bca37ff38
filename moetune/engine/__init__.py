"""Sequences, sampling and the generation loop (schedule → run model → sample/postprocess)."""
