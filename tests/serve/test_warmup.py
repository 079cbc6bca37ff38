"""serve's warm-up (serve/warmup.py): after it, the requests a server meets first (bench-serve's
prompts at one row and at every slot, sampling, logprobs, a long prompt, a prefix-cache hit) call no
CPU kernel with a type signature it has not compiled yet; and it leaves no trace in the engine."""

from moetune.config import parse_config
from moetune.engine.sampling import SamplingParams

SEQS = 24  # more than the 16 x rows of the kernels' integer paths


def _generator():
    from moetune.engine.build import build_generator

    return build_generator(parse_config({"model": {"path": "stdlib-moe", "device": "cpu"},
                                         "engine": {"max_num_seqs": SEQS}}))


def _run(engine, prompts: list[list[int]], params: list[SamplingParams]) -> list[list[int]]:
    rids = [engine.add_request(p, q) for p, q in zip(prompts, params)]
    tokens = {rid: [] for rid in rids}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id].append(out.new_token)
    return [tokens[rid] for rid in rids]


def _first_requests(generator) -> list[tuple[list[list[int]], list[SamplingParams]]]:
    """Batches as a server's first clients send them: bench-serve's held-out prompts (cut to 1,000
    characters) alone and at every slot, sampled ones with logprobs, a long prompt, a repeated one."""
    from moetune.profile.workload import Workload, load_prompt_texts, prompts_path

    texts = [generator.encode(t[:1000]) for t in load_prompt_texts(prompts_path(Workload()))]
    greedy = SamplingParams(max_tokens=24, ignore_eos=True)
    sampled = [SamplingParams(max_tokens=6, temperature=0.9, top_p=0.9, top_k=50, seed=i, logprobs=3, ignore_eos=True)
               for i in range(4)]
    long = (texts[0] * 8)[:900]
    return [([generator.encode("def f(x):")], [SamplingParams(max_tokens=4)]),
            (texts[:1], [greedy]), (texts[:SEQS], [greedy] * SEQS),
            (texts[:4], sampled), ([long, texts[1]], [greedy, greedy]), ([texts[1] + texts[2]], [greedy])]


def test_after_the_warm_up_no_first_request_compiles_a_kernel_and_the_engine_forgot_it():
    from moetune.kernels.cpu.runtime import compiled_signatures
    from moetune.serve.warmup import warm_engine

    generator = _generator()
    engine = generator.engine
    report = warm_engine(engine)
    warmed = compiled_signatures()
    assert warmed, "the bundled model runs no numba kernel here: the check below would be empty"
    assert report.steps > 0 and report.requests == SEQS + 2
    assert sum(engine.stats.steps.values()) == engine.stats.computed_tokens == 0  # counters zeroed
    assert engine.blocks.num_free == engine.blocks.num_blocks and not engine.has_unfinished()
    for prompts, params in _first_requests(generator):
        _run(engine, prompts, params)
    grown = {name: (warmed.get(name, 0), n) for name, n in compiled_signatures().items() if n != warmed.get(name, 0)}
    assert grown == {}, f"compiled after the warm-up (signatures before, after): {grown}"


def test_the_warm_up_changes_no_token():
    from moetune.serve.warmup import warm_engine

    generator = _generator()
    engine = generator.engine
    prompts = [generator.encode(p) for p in ("def parse(x):\n", "import os\n" * 20)]
    params = [SamplingParams(max_tokens=12, ignore_eos=True),
              SamplingParams(max_tokens=12, temperature=0.8, seed=5, ignore_eos=True)]
    before = _run(engine, prompts, params)
    warm_engine(engine)
    assert _run(engine, prompts, params) == before


def test_an_engine_that_cannot_take_every_warm_up_prompt_still_warms_and_starts():
    from moetune.engine.build import build_generator
    from moetune.serve.warmup import warm_engine

    generator = build_generator(parse_config({"model": {"path": "stdlib-moe", "device": "cpu"},
                                              "engine": {"max_num_seqs": 4, "max_num_batched_tokens": 64,
                                                         "chunked_prefill": False, "num_kv_blocks": 12}}))
    report = warm_engine(generator.engine)  # prompts over 64 tokens (or 12 blocks) are left out
    assert report.steps > 0 and not generator.engine.has_unfinished()
