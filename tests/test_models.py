"""Model discovery order: explicit path > /opt/ml/model-style dir > shipped default."""
from __future__ import annotations

import pytest

from adapter.engine.engine import Engine
from adapter.engine.models import ModelNotFound, find_gguf, resolve_model, shipped_path


@pytest.fixture
def sm_dir(tmp_path, monkeypatch):
    root = tmp_path / "opt-ml-model"
    (root / "nested").mkdir(parents=True)
    monkeypatch.setenv("SEMIF_SAGEMAKER_MODEL_DIR", str(root))
    monkeypatch.delenv("SEMIF_MODEL", raising=False)
    return root


def test_shipped_default_when_nothing_else(sm_dir):
    c = resolve_model()
    assert c.source == "shipped" and c.shipped == "smollm2" and c.path.suffix == ".gguf"


def test_sagemaker_dir_wins_over_shipped(sm_dir):
    gemma = shipped_path("gemma3-270m")
    (sm_dir / "nested" / "model.gguf").symlink_to(gemma)  # two levels deep, like the DLC looks
    c = resolve_model()
    assert c.source == "sagemaker" and c.path == gemma.resolve()
    engine = Engine(c)  # and it really loads: a Gemma, not the shipped SmolLM2 default
    assert engine.info.source == "sagemaker" and "gemma3" in engine.info.description


def test_explicit_path_wins_over_both(sm_dir, tmp_path, monkeypatch):
    (sm_dir / "a.gguf").symlink_to(shipped_path("gemma3-270m"))
    explicit = tmp_path / "mine.gguf"
    explicit.symlink_to(shipped_path("smollm2"))
    monkeypatch.setenv("SEMIF_MODEL", str(explicit))
    c = resolve_model()
    assert c.source == "explicit" and c.path == explicit.resolve()
    assert resolve_model(str(sm_dir / "a.gguf")).path.name.startswith("gemma")  # CLI flag beats env


def test_shipped_name_as_explicit(sm_dir, monkeypatch):
    monkeypatch.setenv("SEMIF_MODEL", "gemma3-270m")
    assert resolve_model().shipped == "gemma3-270m"


def test_missing_explicit_path_is_a_clear_error(sm_dir, monkeypatch):
    monkeypatch.setenv("SEMIF_MODEL", "/nope/model.gguf")
    with pytest.raises(ModelNotFound, match="does not exist"):
        resolve_model()


def test_find_gguf_prefers_top_level_and_sorts(tmp_path):
    (tmp_path / "sub").mkdir()
    for p in (tmp_path / "sub" / "a.gguf", tmp_path / "z.gguf", tmp_path / "b.gguf"):
        p.write_bytes(b"x")
    assert find_gguf(tmp_path).name == "b.gguf"
    assert find_gguf(tmp_path / "missing") is None
