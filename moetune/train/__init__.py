"""Recipe that trains moetune's bundled MoE model (`stdlib-moe`) on the Python standard library.

Run it with ``python -m moetune.train recipes/train-stdlib-moe.yaml [--out DIR]``.
Modules: corpus (file selection + split), tokenizer (byte-level BPE), train (model + loop + export),
evaluate (perplexity, unigram baseline, routing load), samples (prompts + eval sample), card (README).
Nothing here imports the rest of moetune.
"""
