"""Adaptive k (`engine.speculative: METHOD:K:auto`): before each step the engine asks how many
draft tokens (0 .. K) each decoding sequence should verify, from the acceptance measured so far and
the batch size.

With a per-token acceptance p, a sequence that verifies k drafts gains E(k) = 1 + p + … + p^k
tokens; the step computes B·(1 + k) rows for a batch of B. The engine's decode steps are timed as
they run, whole (drafting, the forward, verification, an MTP layer's pass), and fitted to
t(R) = t0 + t1·R (R rows; exponentially weighted least squares), and k is
the one of 0 .. K with the most tokens per second, B·E(k) / t(B·(1 + k)). So k falls to 0 when
nothing is accepted (a verify row costs t1 and gains nothing), rises to K when every draft is, and
shrinks as the batch grows (t1·B outgrows t0: the step turns compute-bound). Until the rows of the
timed steps vary, the fit takes PRIOR_KNEE: t1 = t0 / PRIOR_KNEE.

p is a running estimate: each verify of k drafts with a accepted is a + [a < k] trials of which a
succeeded (the drafts after the first rejection were never tried), the counts decayed by DECAY
per step that verified. While k = 0 no draft is verified, so every PROBE_EVERY-th such step asks
for one draft, which keeps p measured (a text that turns repetitive brings k back).

Greedy output does not depend on k (verification keeps exactly the target's tokens).
"""

from __future__ import annotations

from collections import Counter

DECAY = 0.9  # weight of the earlier acceptance counts after each step that verified drafts
TIME_DECAY = 0.97  # weight of the earlier step timings after each timed step
PRIOR_ACCEPTED, PRIOR_TRIALS = 1.0, 2.0  # acceptance 0.5 before any draft is verified
PRIOR_KNEE = 8.0  # rows at which a step costs twice a one-row step, until the timings say otherwise
PROBE_EVERY = 16  # while k = 0, one step in this many verifies one draft per sequence
MIN_SPREAD = 0.25  # weighted variance of the timed steps' rows (rows²) below which the slope is the prior's


class AdaptiveK:
    def __init__(self, k_max: int):
        self.k_max = k_max
        self.accepted, self.trials = PRIOR_ACCEPTED, PRIOR_TRIALS
        self._fit = [0.0] * 5  # Σw, Σw·R, Σw·t, Σw·R², Σw·R·t over the timed steps (decayed)
        self._idle = 0  # steps since k was last above 0
        self.chosen: Counter[int] = Counter()  # k → steps it was chosen for

    @property
    def acceptance(self) -> float:
        return self.accepted / self.trials

    def choose(self, batch: int) -> int:
        """k for a step of `batch` decoding sequences (0: plain decoding this step)."""
        if batch <= 0:
            return 0
        t0, t1 = self.step_time()
        p = self.acceptance
        best, best_rate, gain = 0, 0.0, 0.0
        for k in range(self.k_max + 1):
            gain += p**k  # E(k) = 1 + p + … + p^k
            rate = gain / (t0 + t1 * batch * (1 + k))
            if rate > best_rate * (1 + 1e-9):
                best, best_rate = k, rate
        self._idle = 0 if best else self._idle + 1
        if best == 0 and self._idle % PROBE_EVERY == 0:
            best = 1
        self.chosen[best] += 1
        return best

    def heard(self, drafted: int, accepted: int) -> None:
        """One sequence's verify: `accepted` of its `drafted` tokens kept."""
        self.accepted += accepted
        self.trials += accepted + (accepted < drafted)

    def step_verified(self) -> None:
        """After a step whose verifies were all `heard`: older counts weigh less."""
        self.accepted *= DECAY
        self.trials *= DECAY

    def timed(self, rows: int, seconds: float) -> None:
        """A decode step of `rows` rows took `seconds`."""
        f = [v * TIME_DECAY for v in self._fit]
        for i, v in enumerate((1.0, rows, seconds, rows * rows, rows * seconds)):
            f[i] += v
        self._fit = f

    def step_time(self) -> tuple[float, float]:
        """(t0, t1) of t(R) = t0 + t1·R: fitted to the timed steps, in seconds; (1, 1 / PRIOR_KNEE)
        before any (only their ratio matters)."""
        w, sr, st, srr, srt = self._fit
        if w <= 0 or st <= 0:
            return 1.0, 1.0 / PRIOR_KNEE
        mr, mt = sr / w, st / w
        var = srr / w - mr * mr
        if var < MIN_SPREAD:  # all steps had about the same rows: the prior's slope through their mean
            t0 = mt / (1 + mr / PRIOR_KNEE)
            return t0, t0 / PRIOR_KNEE
        t1 = (srt / w - mr * mt) / var
        t1 = min(max(t1, mt * 1e-3), mt)  # timing noise: a row costs something, and less than a step
        return max(mt - t1 * mr, mt * 1e-2), t1
