"""Reading a request body safely: size caps before and after Content-Encoding, a read timeout,
decompression as a stream that stops at the cap (a 1 GiB gzip or zstd bomb costs a few MB), and
JSON parsing that turns every malformed input - deep nesting, 5,000-digit integers, NaN - into a
client error instead of an exception.
"""
from __future__ import annotations

import asyncio
import json
import zlib
from typing import Any

from .http_errors import HTTPProblem
from .settings import AdapterSettings

ZSTD_SLICE = 256  # compressed bytes fed per step: bounds the output of one step (RLE blocks ~128 KB each)
INFLATE_STEP = 1 << 20


def too_large(what: str, limit: int, setting: str) -> HTTPProblem:
    return HTTPProblem(413, "payload_too_large", f"{what} is larger than {limit} bytes ({setting}): "
                       "split the request into smaller ones")


async def read_raw(request, settings: AdapterSettings) -> bytes:
    """The body as sent, at most max_body bytes, each chunk within body_timeout seconds."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > settings.max_body:
        raise too_large("the body", settings.max_body, "SM_SEMIF_MAX_BODY_BYTES")
    chunks, size = [], 0
    stream = request.stream().__aiter__()
    while True:
        try:
            chunk = await asyncio.wait_for(stream.__anext__(), settings.body_timeout)
        except StopAsyncIteration:
            break
        except asyncio.TimeoutError:
            raise HTTPProblem(408, "body_timeout", f"the request body stopped arriving for {settings.body_timeout:g} s "
                              "(SM_SEMIF_BODY_TIMEOUT): send the whole body at once") from None
        size += len(chunk)
        if size > settings.max_body:
            raise too_large("the body", settings.max_body, "SM_SEMIF_MAX_BODY_BYTES")
        chunks.append(chunk)
    return b"".join(chunks)


GZIP_WBITS = 31  # zlib: a gzip header and trailer


def decode(raw: bytes, encoding: str | None, cap: int) -> bytes:
    """Undo Content-Encoding (identity, gzip, deflate, zstd) without ever holding more than `cap`
    bytes of output (plus one bounded step)."""
    enc = (encoding or "identity").strip().lower()
    if enc in ("", "identity"):
        return raw
    if enc in ("gzip", "x-gzip"):
        return _inflate(raw, GZIP_WBITS, cap, enc)
    if enc == "deflate":  # HTTP's deflate is zlib-wrapped; some clients send it raw
        try:
            return _inflate(raw, 15, cap, enc)
        except HTTPProblem as exc:
            if exc.status == 413:
                raise
            return _inflate(raw, -15, cap, enc)
    if enc == "zstd":
        return _unzstd(raw, cap)
    raise HTTPProblem(415, "unsupported_encoding",
                      f"Content-Encoding {enc!r} is not supported: send identity, gzip, deflate or zstd")


def _inflate(raw: bytes, wbits: int, cap: int, enc: str) -> bytes:
    """Inflate as a stream, stopping at `cap`. gzip may hold several members back to back (RFC 1952):
    all are decoded, the cap counting them together; bytes after a deflate stream are an error."""
    out, size, data = [], 0, raw
    while True:
        d = zlib.decompressobj(wbits)
        try:
            while True:
                piece = d.decompress(data, INFLATE_STEP)
                size += len(piece)
                if size > cap:
                    raise too_large("the decompressed body", cap, "SM_SEMIF_MAX_DECODED_BYTES")
                out.append(piece)
                data = d.unconsumed_tail
                if d.eof or (not data and not piece):
                    break
        except zlib.error as exc:
            raise HTTPProblem(400, "invalid_encoding", f"the body is not valid {enc} data ({exc})") from None
        if not d.eof:
            raise HTTPProblem(400, "invalid_encoding", f"the {enc} body is truncated: send the complete stream")
        data = d.unused_data
        if not data:
            return b"".join(out)
        if wbits != GZIP_WBITS:
            raise HTTPProblem(400, "invalid_encoding", f"{len(data)} bytes follow the end of the {enc} stream: "
                              "send exactly one compressed stream")


def _unzstd(raw: bytes, cap: int) -> bytes:
    """Decompress zstd frames one after another (a body may hold several), stopping at `cap`."""
    import zstandard

    out, size, rest = [], 0, raw
    while rest:
        d = zstandard.ZstdDecompressor().decompressobj()
        i = 0
        try:
            while i < len(rest) and not d.eof:
                piece = d.decompress(rest[i: i + ZSTD_SLICE])
                i += ZSTD_SLICE
                size += len(piece)
                if size > cap:
                    raise too_large("the decompressed body", cap, "SM_SEMIF_MAX_DECODED_BYTES")
                out.append(piece)
        except zstandard.ZstdError as exc:
            raise HTTPProblem(400, "invalid_encoding", f"the body is not valid zstd data ({exc})") from None
        if not d.eof:
            raise HTTPProblem(400, "invalid_encoding", "the zstd body is truncated: send the complete frame")
        rest = d.unused_data + rest[i:]
    return b"".join(out)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON (use null or a string)")


def parse_json(body: bytes, max_depth: int) -> Any:
    """json.loads, with every way it can fail raised as ValueError carrying a position when known."""
    try:
        value = json.loads(body, parse_constant=_reject_constant)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise ValueError(f"JSON nested too deeply: at most {max_depth} levels") from None
    except UnicodeDecodeError:
        raise ValueError("the body is not UTF-8 text") from None
    except ValueError as exc:
        if "integer string conversion" in str(exc):
            raise ValueError("an integer has more than 4300 digits: send such numbers as strings") from None
        raise
    depth = nesting(value, max_depth)
    if depth > max_depth:
        raise ValueError(f"JSON nested {depth}+ levels deep: at most {max_depth} levels")
    return value


def nesting(value: Any, limit: int) -> int:
    """Depth of nested arrays/objects, counting stops past `limit` (iterative: no recursion)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            if deepest > limit:
                return deepest
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest
