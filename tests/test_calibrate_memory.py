"""`calibrate --head-sources` shares one engine pool (one model resident by default) between the target and
its sources (issue 45):
a source on the target's model reuses the target's loaded engine instead of loading the model again
(before, each target had a pool of its own, so every source kept its own copy of a model resident -
5.8-6.0 GB RSS with three sources), and at most SEMIF_MAX_LOADED_MODELS models are resident."""
from __future__ import annotations

from collections import Counter

from adapter.engine.engine import Engine
from app import __main__ as app_main
from app.targets import engines
from tests.conftest import subset_file


def test_head_sources_on_the_targets_model_load_it_once(tmp_path, monkeypatch):
    loads: Counter[str] = Counter()

    def counted(ref, config=None, progress=None):  # type: ignore[no-untyped-def]
        loads[ref] += 1
        return Engine(ref, config, progress=progress)

    monkeypatch.setattr(engines, "Engine", counted)
    monkeypatch.setenv("SM_SEMIF_KV_CACHE_DIR", str(tmp_path / "kv"))
    rc = app_main.main(["calibrate", "--db", str(tmp_path / "wb.db"), "--quiet", "--policy", "refund-check",
                        "--labeled-set", str(subset_file(tmp_path, "refund-check", 6)),
                        "--head-sources", "local", "--out", str(tmp_path / "p.json")])
    assert rc == 0
    assert loads == Counter({"smollm2": 1}), loads  # the target and its source: one engine, loaded once (before: two)
