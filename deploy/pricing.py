"""A rough cost hint per hour (on-demand SageMaker real-time inference, us-east-1, USD). Prices
change and differ by region: this is a hint for the confirmation screen, not a quote."""
from __future__ import annotations

HOURLY_USD = {
    "ml.c7i.xlarge": 0.21, "ml.c7i.2xlarge": 0.43, "ml.m5.xlarge": 0.23, "ml.m5.2xlarge": 0.46,
    "ml.c5.xlarge": 0.20, "ml.c6i.xlarge": 0.20,
    "ml.g6e.xlarge": 2.34, "ml.g6.xlarge": 1.01, "ml.g5.xlarge": 1.41, "ml.g4dn.xlarge": 0.74,
}


def hint(cfg) -> str:
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
