"""Shipped models are recognised by their bytes (size, then a cached sha256), never by file name: a
shipped GGUF renamed or linked - as a packager or /opt/ml/model may hold it - keeps its measured readout
and correction in the adapter, in packaging (app/service/deploy.model_for) and so in every container
that loads it (endpoints and Batch Transform resolve /opt/ml/model the same way)."""
from __future__ import annotations

import shutil

import pytest

from adapter.engine import models
from adapter.engine.catalog import SHIPPED
from adapter.engine.models import resolve_model, shipped_by_content, shipped_by_sha256, shipped_path


@pytest.fixture
def hashes(tmp_path, monkeypatch):
    """A private sha256 cache, and a count of the files really hashed."""
    monkeypatch.setattr(models, "CACHE_DIR", tmp_path / "cache")
    seen: list[str] = []
    real = models.sha256_file

    def counting(path):
        seen.append(str(path))
        return real(path)
    monkeypatch.setattr(models, "sha256_file", counting)
    return seen


@pytest.fixture
def renamed(tmp_path):
    """A copy of the shipped SmolLM2 under a packager's name, in a SageMaker-style model folder."""
    folder = tmp_path / "opt-ml-model"
    folder.mkdir()
    shutil.copyfile(shipped_path("smollm2"), folder / "model.gguf")
    return folder / "model.gguf"


def test_a_renamed_copy_and_a_link_are_the_shipped_model(renamed, hashes, monkeypatch, tmp_path):
    monkeypatch.setenv("SEMIF_SAGEMAKER_MODEL_DIR", str(renamed.parent))
    monkeypatch.delenv("SEMIF_MODEL", raising=False)
    choice = resolve_model()
    assert (choice.source, choice.shipped, choice.path.name) == ("sagemaker", "smollm2", "model.gguf")
    link = tmp_path / "anything.gguf"
    link.symlink_to(renamed)
    assert resolve_model(str(link)).shipped == "smollm2"
    assert hashes == [str(renamed.resolve())]  # the link resolves to the copy: hashed once, not twice


def test_the_hash_is_cached_by_path_size_and_mtime(renamed, hashes):
    assert shipped_by_content(renamed) == shipped_by_content(renamed) == "smollm2"
    assert len(hashes) == 1  # a restart does not re-hash the file
    st = renamed.stat()
    import os

    os.utime(renamed, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # touched: it may have changed
    assert shipped_by_content(renamed) == "smollm2" and len(hashes) == 2


def test_a_file_with_a_shipped_name_but_other_bytes_is_not_shipped(tmp_path, hashes):
    fake = tmp_path / SHIPPED["smollm2"].file_name
    fake.write_bytes(b"GGUF" + b"\0" * 100)
    assert shipped_by_content(fake) is None
    assert hashes == []  # no shipped model has this size: nothing is hashed
    same_size = tmp_path / "padded.gguf"
    with same_size.open("wb") as f:
        f.truncate(SHIPPED["smollm2"].size)  # the right size, the wrong bytes
    assert shipped_by_content(same_size) is None and hashes == [str(same_size.resolve())]


def test_every_pinned_identity_is_distinct():
    ids = [sha for m in SHIPPED.values() for _, sha in m.identities()]
    assert len(ids) == len(set(ids)) and all(len(s) == 64 for s in ids)
    assert {shipped_by_sha256(sha) for m in SHIPPED.values() for _, sha in m.identities()} == set(SHIPPED)


def test_the_renamed_model_loads_with_its_measured_readout(renamed, monkeypatch):
    from adapter.engine.engine import Engine

    monkeypatch.setenv("SEMIF_MODEL", str(renamed))
    info = Engine(resolve_model()).info
    assert (info.shipped, info.default_readout, info.default_debias) == (
        "smollm2", SHIPPED["smollm2"].default_readout, SHIPPED["smollm2"].default_debias)


def test_packaging_finds_the_calibrated_model_by_its_sha256(renamed):
    from adapter.engine.models import file_sha256
    from app.service.deploy import model_for

    sha = file_sha256(renamed)  # a policy calibrated on the renamed copy records this, and file "model.gguf"
    assert model_for("", sha) == str(shipped_path("smollm2"))
    assert model_for("", "0" * 64) == ""  # an unknown model: the default
    assert model_for(str(renamed), sha) == str(renamed)  # the one asked for wins


def test_an_image_layer_that_dropped_the_sub_second_mtime_does_not_cost_a_re_hash(renamed, hashes):
    """Container image layers keep whole-second mtimes: the hash recorded when the image was built (with
    nanoseconds) still counts in the container; a file really changed (another second) is hashed again."""
    import os

    st = renamed.stat()
    os.utime(renamed, ns=(st.st_atime_ns, st.st_mtime_ns // 10**9 * 10**9 + 123_456_789))
    assert shipped_by_content(renamed) == "smollm2" and len(hashes) == 1
    os.utime(renamed, ns=(st.st_atime_ns, st.st_mtime_ns // 10**9 * 10**9))  # as a layer restores it
    assert shipped_by_content(renamed) == "smollm2" and len(hashes) == 1
    os.utime(renamed, ns=(st.st_atime_ns, (st.st_mtime_ns // 10**9 + 5) * 10**9))  # changed since
    assert shipped_by_content(renamed) == "smollm2" and len(hashes) == 2
