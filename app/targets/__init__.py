"""Where decisions come from: one Target interface (base.py), the kinds (local.py, remote.py, chat.py,
batch.py) and the registry that says what each kind needs (registry.py)."""
from app.targets.base import KEY_PREFIX, Target, TargetError, TargetResult
from app.targets.local import LocalTarget
from app.targets.registry import LOCAL_DEFAULT, build_target, target_by_name, target_specs, validate_target_spec

__all__ = ["KEY_PREFIX", "LOCAL_DEFAULT", "LocalTarget", "Target", "TargetError", "TargetResult", "build_target",
           "target_by_name", "target_specs", "validate_target_spec"]
