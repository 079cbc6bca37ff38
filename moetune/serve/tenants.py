"""Per-tenant token-rate limits: a token bucket per tenant named in serve.tenants.

A request reserves its prompt tokens plus its max_tokens when admitted; what it did not use is
given back when it ends. A tenant whose bucket cannot cover a request gets 429 with the seconds
until it could. Tenants not in the config (and requests without the header) are not limited.
"""

from __future__ import annotations

import math
import time

from moetune.config import TenantConfig
from moetune.serve.protocol import APIError

TENANT_HEADER = "x-tenant"


class _Bucket:
    def __init__(self, rate: float, size: float, clock):
        self.rate, self.size, self.clock = rate, size, clock
        self.level, self.t = size, clock()

    def refill(self) -> None:
        now = self.clock()
        self.level = min(self.size, self.level + (now - self.t) * self.rate)
        self.t = now


class TenantLimiter:
    def __init__(self, tenants: dict[str, TenantConfig], clock=time.monotonic):
        self.buckets = {name: _Bucket(t.tokens_per_s, float(t.burst_tokens or math.ceil(t.tokens_per_s)), clock)
                        for name, t in tenants.items() if t.tokens_per_s is not None}

    def charge(self, tenant: str, tokens: int) -> None:
        bucket = self.buckets.get(tenant)
        if bucket is None:
            return
        if tokens > bucket.size:
            raise APIError(400, f"the request may use {tokens} tokens but tenant '{tenant}' may burst at most "
                           f"{int(bucket.size)}; lower max_tokens or shorten the prompt", param="max_tokens")
        bucket.refill()
        if bucket.level < tokens:
            wait = math.ceil((tokens - bucket.level) / bucket.rate)
            raise APIError(429, f"tenant '{tenant}' is over its rate of {bucket.rate:g} tokens/s; retry in {wait} s",
                           "rate_limit_error", headers={"Retry-After": str(wait)})
        bucket.level -= tokens

    def refund(self, tenant: str, tokens: int) -> None:
        bucket = self.buckets.get(tenant)
        if bucket is not None and tokens > 0:
            bucket.refill()
            bucket.level = min(bucket.size, bucket.level + tokens)
