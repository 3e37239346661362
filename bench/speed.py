"""Speed choices benchmark (not a test): each ratio is measured in one run, both sides back to back.

(a) HTTP on a kept-alive connection: a listening socket made with proto 0 (Nagle stays on for
    accepted sockets) vs the adapter's `bind_socket` (IPPROTO_TCP: asyncio turns Nagle off)
(b) SmolLM2 as the package ships it (Q4_1) vs the re-encoded F16 file the catalog loads
(c) flash attention off vs on, on each shipped chat model
(d) model.tar.gz of the default GGUF: gzip level 1 vs stored blocks (level 0)

Run: .venv/bin/python -m bench.speed   (about 2 minutes on 2 cores)
"""
from __future__ import annotations

import argparse
import asyncio
import gzip
import socket
import statistics
import tarfile
import tempfile
import time
from pathlib import Path

import llama_cpp

from adapter.engine.catalog import DEFAULT_SHIPPED, SHIPPED
from adapter.engine.models import package_file, shipped_path
from adapter.server.process import bind_socket
from bench.report import publish

RESPONSE = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n"


def keepalive_ms(make_socket, n: int = 40) -> float:
    """Median ms per request/response on one connection, the response written as headers + body
    in two writes (what uvicorn does)."""
    async def run() -> float:
        sock = make_socket()

        async def handle(reader, writer):
            try:
                while await reader.readline():
                    while (await reader.readline()) not in (b"\r\n", b""):
                        pass
                    writer.write(RESPONSE)
                    await writer.drain()
                    writer.write(b'{"ok":true}')
                    await writer.drain()
            except (asyncio.CancelledError, ConnectionError):
                pass

        server = await asyncio.start_server(handle, sock=sock)
        async with server:
            reader, writer = await asyncio.open_connection(*sock.getsockname()[:2])
            times = []
            for _ in range(n):
                t = time.perf_counter()
                writer.write(b"GET /ping HTTP/1.1\r\nhost: x\r\n\r\n")
                await reader.readuntil(b"\r\n\r\n")
                await reader.readexactly(11)
                times.append(time.perf_counter() - t)
            writer.close()
            await writer.wait_closed()
        return 1000 * statistics.median(times[1:])

    return asyncio.run(run())


def proto0_socket() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    return s


def prompt_seconds(path: Path, n_tokens: int, flash_attn: bool = True) -> float:
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=2048, n_batch=512, n_threads=2, n_threads_batch=2,
                          flash_attn=flash_attn, verbose=False)
    toks = llm.tokenize(("The quick brown fox jumps over the lazy dog. " * 200).encode())[:n_tokens]
    best = float("inf")
    for _ in range(3):
        llm.reset()
        llm._ctx.kv_cache_clear()
        t = time.perf_counter()
        llm.eval(toks)
        best = min(best, time.perf_counter() - t)
    llm.close()
    return best


def tarball_seconds(gguf: Path, level: int) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "model.tar.gz"
        t = time.perf_counter()
        with out.open("wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", compresslevel=level,
                                                   mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
            tar.add(str(gguf), arcname=gguf.name)
        return time.perf_counter() - t, out.stat().st_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-publish", action="store_true", help="print only; leave docs/benchmarks.md as it is")
    args = ap.parse_args()
    rows: list[tuple[str, str]] = []

    def row(what: str, measured: str) -> None:
        rows.append((what, measured))
        print(f"{what}: {measured}", flush=True)

    nagle, nodelay = keepalive_ms(proto0_socket), keepalive_ms(lambda: bind_socket("127.0.0.1", 0))
    row("response on a kept-alive connection, Nagle on (proto-0 socket) vs the adapter's socket",
        f"{nagle:.1f} ms vs {nodelay:.2f} ms (median)")

    q41, f16 = package_file(SHIPPED["smollm2"]), shipped_path("smollm2")
    a, b = prompt_seconds(q41, 200), prompt_seconds(f16, 200)
    row("SmolLM2, 200 prompt tokens, the package's Q4_1 vs the re-encoded F16", f"{a:.3f} s vs {b:.3f} s: **{a / b:.2f}x**")

    flash = []
    for name, n in (("smollm2", 200), ("smollm2", 1800), ("qwen2.5-coder-0.5b", 200), (DEFAULT_SHIPPED, 200)):
        off, on = prompt_seconds(shipped_path(name), n, False), prompt_seconds(shipped_path(name), n, True)
        flash.append(f"{name} at {n} tokens {off:.3f} s vs {on:.3f} s ({off / on:.2f}x)")
    row("flash attention off vs on", "; ".join(flash))

    gguf = shipped_path(DEFAULT_SHIPPED)
    (t1, s1), (t0, s0) = tarball_seconds(gguf, 1), tarball_seconds(gguf, 0)
    row(f"`model.tar.gz` of {gguf.name}: gzip level 1 vs stored blocks",
        f"{t1:.1f} s vs {t0:.1f} s (**{t1 / t0:.0f}x**), {100 * (s0 - s1) / s1:.1f}% larger "
        f"({s1 / 1e6:,.0f} vs {s0 / 1e6:,.0f} MB)")
    if not args.no_publish:
        publish("speed", "Ratios in one run:\n\n| | measured |\n|---|---|\n"
                + "\n".join(f"| {w} | {m} |" for w, m in rows) + "\n")


if __name__ == "__main__":
    main()
