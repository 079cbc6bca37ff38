"""Adaptive k (`engine.speculative: METHOD:K:auto`): before each step the engine asks how many
draft tokens (0 .. K) each decoding sequence should verify, from the acceptance measured so far and
the batch size.

With a per-token acceptance p, a sequence that verifies k drafts gains E(k) = 1 + p + … + p^k
tokens; the step computes B·(1 + k) rows for a batch of B. The engine's decode steps are timed as
they run, whole (drafting, the forward, verification, an MTP layer's pass), through a `StepClock`
(the wall clock; a test injects a cost model), and fitted per kind (steptime.py): verify steps to
t_v(R) = t0_v + t1·R and plain decode steps (k = 0) to t_p(R) = t0_p + t1·R (R rows; exponentially
weighted least squares; a kind whose rows barely vary takes the other kind's measured slope, else
t1 = t0 / PRIOR_KNEE). k = 0 is priced by the plain fit, k > 0 by the verify fit, and k is the one
of 0 .. K with the most tokens per second: B / t_p(B) against B·E(k) / t_v(B·(1 + k)). So the
fixed cost a step pays for verifying at all (t0_v − t0_p: the drafter, verification on the host)
is measured, not charged to plain decoding too: k falls to 0 when nothing is accepted or when that
fixed cost outweighs what the accepted drafts save, rises to K when every draft is and verify rows
are cheap, and shrinks as the batch grows (t1·B outgrows t0: the step turns compute-bound).

A step timed over CLIP times its kind's fitted time (the other kind's while its own has none)
counts as CLIP times it: a step the machine stalled (another process took the core, a first call
compiled a kernel) would otherwise weigh on a rarely timed kind for dozens of its steps.

Both fits need steps of their kind: while k > 0, every PLAIN_EVERY-th step decodes plainly (k = 0),
which measures a plain step at the current batch; while k = 0, every PROBE_EVERY-th step verifies
one draft, which keeps p and the verify fit measured (a text that turns repetitive brings k back).
Until a kind has been timed, the other kind's fit stands in for it (no fixed cost known).

p is a running estimate: each verify of k drafts with a accepted is a + [a < k] trials of which a
succeeded (the drafts after the first rejection were never tried), the counts decayed by DECAY
per step that verified.

Greedy output does not depend on k (verification keeps exactly the target's tokens).
"""

from __future__ import annotations

from collections import Counter

from moetune.engine.speculative.steptime import PRIOR_KNEE, StepClock, StepFit, WallClock

DECAY = 0.9  # weight of the earlier acceptance counts after each step that verified drafts
TIME_DECAY = 0.97  # weight of the earlier step timings (both kinds) after each timed decode step
CLIP = 4.0  # a timed step counts as at most this many times its kind's fitted time
PRIOR_ACCEPTED, PRIOR_TRIALS = 1.0, 2.0  # acceptance 0.5 before any draft is verified
PROBE_EVERY = 16  # while k = 0, one step in this many verifies one draft per sequence
PLAIN_EVERY = 16  # while k > 0, one step in this many decodes plainly (k = 0): the plain step measured


class AdaptiveK:
    def __init__(self, k_max: int, clock: StepClock | None = None):
        self.k_max = k_max
        self.clock: StepClock = clock or WallClock()
        self.accepted, self.trials = PRIOR_ACCEPTED, PRIOR_TRIALS
        self.plain, self.verify = StepFit(TIME_DECAY), StepFit(TIME_DECAY)  # timed decode steps by kind
        self._idle = 0  # steps since k was last above 0
        self._drafting = 0  # steps since k was last 0
        self.chosen: Counter[int] = Counter()  # k → steps it was chosen for

    @property
    def acceptance(self) -> float:
        return self.accepted / self.trials

    def choose(self, batch: int) -> int:
        """k for a step of `batch` decoding sequences (0: plain decoding this step)."""
        if batch <= 0:
            return 0
        best = self.best(batch)
        self._idle = 0 if best else self._idle + 1
        self._drafting = self._drafting + 1 if best else 0
        if best == 0 and self._idle % PROBE_EVERY == 0:
            best = 1  # a probe: one draft keeps p measured
        elif best and self._drafting % PLAIN_EVERY == 0:
            best = 0  # a plain step measured at this batch
        self.chosen[best] += 1
        return best

    def best(self, batch: int) -> int:
        """The k of 0 .. K with the most tokens per second at `batch`, by the fits and p."""
        (p0, p1), (v0, v1) = self.step_time(verified=False), self.step_time(verified=True)
        p = self.acceptance
        best, best_rate, gain = 0, 1.0 / (p0 + p1 * batch), 1.0
        for k in range(1, self.k_max + 1):
            gain += p**k  # E(k) = 1 + p + … + p^k
            rate = gain / (v0 + v1 * batch * (1 + k))
            if rate > best_rate * (1 + 1e-9):
                best, best_rate = k, rate
        return best

    def heard(self, drafted: int, accepted: int) -> None:
        """One sequence's verify: `accepted` of its `drafted` tokens kept."""
        self.accepted += accepted
        self.trials += accepted + (accepted < drafted)

    def step_verified(self) -> None:
        """After a step whose verifies were all `heard`: older counts weigh less."""
        self.accepted *= DECAY
        self.trials *= DECAY

    def step_began(self) -> None:
        self.clock.start()

    def step_ended(self, rows: int, verified: bool) -> None:
        """A decode step of `rows` rows (that `verified` drafts or decoded plainly) ended: timed."""
        self.timed(rows, self.clock.seconds(rows, verified), verified)

    def timed(self, rows: int, seconds: float, verified: bool = True) -> None:
        """A decode step of `rows` rows took `seconds` (a stall clipped to CLIP times the fit)."""
        fit, other = (self.verify, self.plain) if verified else (self.plain, self.verify)
        ref = fit if not fit.empty else other
        if not ref.empty:
            seconds = min(seconds, CLIP * ref.at(rows))
        self.plain.fade()
        self.verify.fade()
        fit.add(rows, seconds)

    def step_time(self, verified: bool = True) -> tuple[float, float]:
        """(t0, t1) of a verify step's (or a plain step's) t(R) = t0 + t1·R, in seconds; the other
        kind's while this kind has no timings; (1, 1 / PRIOR_KNEE) before any (only ratios matter)."""
        own, other = (self.verify, self.plain) if verified else (self.plain, self.verify)
        if own.empty:
            own, other = other, own
        if own.empty:
            return 1.0, 1.0 / PRIOR_KNEE
        return own.line(None if other.empty else other.slope())
