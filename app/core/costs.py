"""Cost per 1,000 decisions (no Streamlit): measured warm latency -> decisions per second at the
concurrency the adapter allows (one engine per instance answers one call at a time) -> the
instance's hourly price -> dollars per 1,000 decisions. Local targets report decisions per second
on this machine instead: they have no price."""
from __future__ import annotations

import math
from typing import Any, Mapping

import pandas as pd

from deploy.pricing import PRICES_AS_OF, PRICES_SOURCE, usd_per_1000

from app.core.store import Store
from app.targets.registry import hourly_price

PRICE_SOURCE = f"{PRICES_SOURCE}, {PRICES_AS_OF}; a hint, not a quote"


def instance_price(target: Mapping[str, Any], store: Store | None) -> tuple[float | None, str]:
    """(hourly USD, what it is) for a target: its own price, else where its kind takes one from (a
    SageMaker endpoint: the deployment behind it; a GPU pool's first choice, as Deploy prices it)."""
    return hourly_price(target, store.get_deployment if store is not None else None)


def with_costs(stats: pd.DataFrame, targets: Mapping[str, Mapping[str, Any]], store: Store | None = None
               ) -> pd.DataFrame:
    """latency_stats plus decisions/s, $/1,000 decisions and how each was computed."""
    out = stats.copy()
    dps, usd, notes = [], [], []
    for _, row in out.iterrows():
        target = targets.get(row["target"], {})
        p50 = row["p50_ms"]
        rate = 1000 / p50 if p50 and not math.isnan(p50) else float("nan")
        dps.append(rate)
        price, what = instance_price(target, store)
        if target.get("kind") == "local":
            usd.append(float("nan"))
            notes.append(f"local: {rate:.2f} decisions/s on this machine, one at a time; no price")
        elif price is None or math.isnan(rate):
            usd.append(float("nan"))
            notes.append("price unknown: deploy it from the Deploy page, or set hourly_usd on the target")
        else:
            usd.append(usd_per_1000(price, rate))
            notes.append(f"${price:.2f}/h for {what} / ({rate:.2f} decisions/s at warm p50, one call at a time)")
    out["decisions_per_s"], out["usd_per_1000"], out["cost_note"] = dps, usd, notes
    return out
