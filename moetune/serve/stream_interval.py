"""How often the engine's thread hands a running request's new tokens to the HTTP front end.

Every hand-over costs the front end (an event, a JSON chunk, a socket write) and the client (a read,
a parse) once per token and request: at 64 running requests on a 2-core machine that is about half
a core (measured: front end 0.16, bench client 0.33 cores), taken from the two cores the model's
OpenMP team waits on at every parallel region; a team thread queued behind them stalls the whole
step (64-row decode step 7 ms in-process, 14-16 ms inside `moetune serve`). Holding a request's
tokens for `interval` steps and sending them as one chunk (vLLM's `--stream-interval`) divides that
work by `interval`. A request's first token, its last one, and requests that ask for logprobs are
sent at once, so time to first token and the end of a request do not move.
"""

from __future__ import annotations


class StreamHold:
    """Per stream, the (choice, RequestOutput, step time) items not yet handed over."""

    def __init__(self, interval: int):
        if interval < 1:
            raise ValueError(f"stream interval must be ≥ 1, got {interval}")
        self.interval = interval
        self._held: dict[int, tuple[object, list, int]] = {}  # id(stream) → (stream, items, steps held)

    def due(self, by_stream: dict[int, tuple[object, list]]) -> dict[int, tuple[object, list]]:
        """This step's items per stream → the streams' items to hand over now (held ones included)."""
        out: dict[int, tuple[object, list]] = {}
        for key, (stream, items) in by_stream.items():
            held = self._held.pop(key, None)
            items = held[1] + items if held else items
            steps = held[2] + 1 if held else 1
            if self._now(stream, items, steps):
                stream.started = True
                out[key] = (stream, items)
            else:
                self._held[key] = (stream, items, steps)
        for key in [k for k in self._held if k not in by_stream]:  # no token this step (preempted, held back)
            stream, items, _ = self._held.pop(key)
            out[key] = (stream, items)
        return out

    def _now(self, stream, items: list, steps: int) -> bool:
        if self.interval == 1 or not stream.started or steps >= self.interval:
            return True
        return any(out.finish_reason is not None or out.logprobs is not None for _, out, _ in items)

    def drop(self, stream) -> None:
        """Forget what `stream` holds (its request was aborted or failed)."""
        self._held.pop(id(stream), None)

    def clear(self) -> None:
        self._held.clear()


AUTO_INTERVAL = 16  # steps; bench-serve at C = 1 / 32 / 64 on 2 cores: 1 → 4 → 16 steps gave 407 / 2,655 / 2,994 →
# 518 / 3,131 / 4,014 → 529 / 3,850 / 4,561 out tok/s (docs/benchmarks.md)


def choose_interval(requested: int | None, device: str, model_threads: int, cores: int) -> tuple[int, str]:
    """The stream interval `moetune serve` runs with, and why (its first line says both): the one asked
    for; else 1 where the front end has a core of its own (the model on a GPU, or on fewer threads than
    the process's cores), AUTO_INTERVAL where the model's OpenMP team takes every core."""
    if requested is not None:
        return requested, "set"
    if device != "cpu":
        return 1, f"auto: the model runs on {device}"
    if model_threads < cores:
        return 1, f"auto: the model's {model_threads} threads leave {cores - model_threads} of {cores} cores to the front end"
    return AUTO_INTERVAL, f"auto: the model's {model_threads} threads take all {cores} cores"
