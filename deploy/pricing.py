"""Rough cost hints (on-demand SageMaker inference, us-east-1, USD per instance-hour). Prices change
and differ by region: these are hints for the confirmation screen, not quotes."""
from __future__ import annotations

from typing import Any

PRICES_SOURCE = "https://aws.amazon.com/sagemaker/pricing/ (on-demand, real-time inference, us-east-1)"
# When the table was taken. Not re-checked here (the build machines cannot reach AWS); set the
# date you verified the numbers when you update them.
PRICES_AS_OF = "unverified (table predates 2026-12-01)"
HOURLY_USD = {
    "ml.c7i.xlarge": 0.21, "ml.c7i.2xlarge": 0.43, "ml.m5.xlarge": 0.23, "ml.m5.2xlarge": 0.46,
    "ml.c5.xlarge": 0.20, "ml.c6i.xlarge": 0.20,
    "ml.g6e.xlarge": 2.34, "ml.g6.xlarge": 1.01, "ml.g5.xlarge": 1.41, "ml.g4dn.xlarge": 0.74,
}


def first_choice(compute: str, instance_type: str | None, pools: Any) -> str | None:
    """The instance type a deployment is priced on everywhere (Deploy and Compare alike): the CPU
    instance type, or the GPU pool's priority-1 entry - the one SageMaker tries first."""
    if compute == "gpu":
        entries = [(str(t), int(p)) for t, p in (pools or [])]
        return min(entries, key=lambda e: e[1])[0] if entries else None
    return instance_type


def hint(cfg: Any) -> str:
    """'~$0.21/h (ml.c7i.xlarge x1)' or a range over the GPU pool."""
    n = cfg.instance_count
    if cfg.compute == "cpu":
        p = HOURLY_USD.get(cfg.instance_type)
        return f"~${p * n:.2f}/h ({cfg.instance_type} x{n})" if p else f"unknown price for {cfg.instance_type}"
    known = [(t, HOURLY_USD[t]) for t, _ in cfg.pools if t in HOURLY_USD]
    if not known:
        return "unknown prices for the pool"
    lo, hi = min(p for _, p in known), max(p for _, p in known)
    return f"~${lo * n:.2f}-${hi * n:.2f}/h depending on which pool wins ({', '.join(t for t, _ in known)})"


def usd_per_1000(hourly_usd: float, decisions_per_second: float, concurrency: int = 1) -> float:
    """USD per 1,000 decisions on one fully busy instance - the one rule, for a price from the table
    (cost_per_1000) or any other (a target's own hourly price, app/core/costs.py): hourly price /
    decisions per hour x 1000 ($0.36/h at one decision a second: 3,600 an hour, $0.10 per 1,000)."""
    return hourly_usd / (decisions_per_second * concurrency * 3600) * 1000


def cost_per_1000(instance_type: str, decisions_per_second: float, concurrency: int = 1) -> tuple[float | None, str]:
    """USD per 1,000 decisions on one fully busy instance: hourly price / decisions per hour x 1000.
    decisions_per_second is one request stream's rate; concurrency is how many streams one instance
    serves at that rate (1 for the SemIf adapter: one model per process, calls serialised). Idle
    time is not counted: an endpoint that waits for traffic costs more per decision."""
    price = HOURLY_USD.get(instance_type)
    if price is None:
        return None, f"no price for {instance_type} in the table ({PRICES_SOURCE}, {PRICES_AS_OF})"
    if decisions_per_second <= 0 or concurrency < 1:
        return None, "throughput must be > 0 decisions/s with concurrency >= 1"
    return usd_per_1000(price, decisions_per_second, concurrency), (f"${price:.2f}/h / ({decisions_per_second:g}/s x {concurrency} x 3600 s) x 1000, "
                 f"fully busy; prices {PRICES_AS_OF}, {PRICES_SOURCE}")
