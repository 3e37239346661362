"""Autoscaling maths for a real-time endpoint: Application Auto Scaling tracks
SageMakerVariantInvocationsPerInstance (invocations per minute per instance), so the target comes
from how many decisions one instance can do per second, kept below saturation."""
from __future__ import annotations

from .config import DeployConfig

DIMENSION = "sagemaker:variant:DesiredInstanceCount"
METRIC = "SageMakerVariantInvocationsPerInstance"
VARIANT = "AllTraffic"

# Decisions per second for one instance on the shipped default model, per instance family.
# CPU: from DESIGN.md section 6 (Qwen2.5-Coder-1.5B Q4_K_M, ~2.2 s per fresh decision on 2 threads;
# an xlarge has 2 physical cores, and the adapter serialises calls: one Llama per process).
# GPU: an unmeasured assumption (no GPU run here) - measure your model and pass the real number.
DEFAULT_DECISIONS_PER_SECOND: dict[str, float] = {
    "c5": 0.4, "c6i": 0.45, "c7i": 0.5, "m5": 0.4, "m6i": 0.45, "m7i": 0.5,
    "g4dn": 4.0, "g5": 8.0, "g6": 6.0, "g6e": 10.0,
}


def family(instance_type: str) -> str:
    """'ml.g6e.xlarge' -> 'g6e'."""
    parts = instance_type.split(".")
    return parts[1] if len(parts) == 3 else instance_type


def serving_types(cfg: DeployConfig) -> list[str]:
    return [t for t, _ in cfg.pools] if cfg.compute == "gpu" else [cfg.instance_type]


def decisions_per_second(cfg: DeployConfig) -> float | None:
    """The measured number if given, else the slowest default over the types that may serve (a
    GPU pool can land on any of them: plan for the slowest). None when a type has no default."""
    if cfg.autoscaling and cfg.autoscaling.decisions_per_second:
        return cfg.autoscaling.decisions_per_second
    if cfg.decisions_per_second:  # measured, autoscaling off
        return cfg.decisions_per_second
    known = [DEFAULT_DECISIONS_PER_SECOND.get(family(t)) for t in serving_types(cfg)]
    return None if not known or None in known else min(k for k in known if k is not None)


def target_invocations_per_minute(decisions_per_second: float, utilisation: float = 0.7) -> float:
    """One invocation = one decision row: per second x 60 x the utilisation to aim for. Clients
    that send arrays of k rows make k times fewer invocations: divide by k for them."""
    if decisions_per_second <= 0 or not 0 < utilisation <= 1:
        raise ValueError("decisions per second must be > 0 and utilisation in (0, 1]")
    return round(decisions_per_second * 60 * utilisation, 2)


def resource_id(endpoint: str, variant: str = VARIANT) -> str:
    return f"endpoint/{endpoint}/variant/{variant}"


def policy_name(endpoint: str) -> str:
    return f"{endpoint}-invocations"
