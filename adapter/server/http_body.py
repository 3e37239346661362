"""Reading a request body safely: size caps before and after Content-Encoding, a read timeout,
decompression as a stream that stops at the cap (a 1 GiB gzip or zstd bomb costs a few MB), a cap on
the number of JSON values counted before anything is parsed. Parsing the body (adapter/json_text.py)
turns every malformed input - deep nesting, 5,000-digit integers, NaN - into a client error instead of
an exception.

Why the element count: `json.loads` is one C call that holds the GIL until it returns. 16 MiB of
`[0,0,...]` (8M values, 16.5 KB as gzip) held it for 1.4 s, 16 MiB of `[[],[],...]` for 6.5 s -
and while one thread holds the GIL, the event loop cannot answer /ping. Counting commas, `[` and `{`
in the raw bytes is a few ms even for 16 MiB (a string's commas count too: an upper bound), and
capping it bounds every parse (250,000 values: 20-70 ms here). The parse itself - strict JSON text,
one GIL-heavy call at a time - is adapter/json_text.py.
"""
from __future__ import annotations

import asyncio
import zlib
from typing import Callable

from starlette.requests import ClientDisconnect, Request

from adapter.server.http_errors import HTTPProblem
from adapter.server.settings import AdapterSettings


class ClientGone(Exception):
    """The client closed the connection before its request was complete: nothing to answer, nothing to log."""

ZSTD_SLICE = 256  # compressed bytes fed per step: bounds the output of one step (RLE blocks ~128 KB each)
INFLATE_STEP = 1 << 20


def too_large(what: str, limit: int, setting: str) -> HTTPProblem:
    return HTTPProblem(413, "payload_too_large", f"{what} is larger than {limit} bytes ({setting}): "
                       "split the request into smaller ones")


async def read_raw(request: Request, settings: AdapterSettings, remaining: Callable[[], float] | None = None) -> bytes:
    """The body as sent, at most max_body bytes, each chunk within body_timeout seconds and the whole
    body within `remaining()` seconds (the request's deadline) when given. ClientGone when the client
    disconnects half-way."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > settings.max_body:
        raise too_large("the body", settings.max_body, "SM_SEMIF_MAX_BODY_BYTES")
    chunks, size = [], 0
    stream = request.stream().__aiter__()
    while True:
        left = remaining() if remaining else settings.body_timeout
        wait = min(settings.body_timeout, left)
        try:
            chunk = await asyncio.wait_for(stream.__anext__(), max(wait, 0.0))
        except StopAsyncIteration:
            break
        except ClientDisconnect:
            raise ClientGone() from None
        except asyncio.TimeoutError:
            if wait < settings.body_timeout:
                raise HTTPProblem(408, "body_timeout", "the request body was still arriving at the request's deadline "
                                  "(SM_SEMIF_REQUEST_TIMEOUT): send the whole body at once") from None
            raise HTTPProblem(408, "body_timeout", f"the request body stopped arriving for {settings.body_timeout:g} s "
                              "(SM_SEMIF_BODY_TIMEOUT): send the whole body at once") from None
        size += len(chunk)
        if size > settings.max_body:
            raise too_large("the body", settings.max_body, "SM_SEMIF_MAX_BODY_BYTES")
        chunks.append(chunk)
    return b"".join(chunks)


GZIP_WBITS = 31  # zlib: a gzip header and trailer


def decode(raw: bytes, encoding: str | None, cap: int, max_elements: int | None = None) -> bytes:
    """Undo Content-Encoding (identity, gzip, deflate, zstd) without ever holding more than `cap`
    bytes of output (plus one bounded step); with `max_elements`, stop (413) as soon as the output
    holds more JSON values than that (see count_elements)."""
    enc = (encoding or "identity").strip().lower()
    limit = Limit(cap, max_elements)
    if enc in ("", "identity"):
        limit.add(raw)
        return raw
    if enc in ("gzip", "x-gzip"):
        return _inflate(raw, GZIP_WBITS, limit, enc)
    if enc == "deflate":  # HTTP's deflate is zlib-wrapped; some clients send it raw
        try:
            return _inflate(raw, 15, limit, enc)
        except HTTPProblem as exc:
            if exc.status == 413:
                raise
            return _inflate(raw, -15, Limit(cap, max_elements), enc)
    if enc == "zstd":
        return _unzstd(raw, limit)
    raise HTTPProblem(415, "unsupported_encoding",
                      f"Content-Encoding {enc!r} is not supported: send identity, gzip, deflate or zstd")


class Limit:
    """What a decoded body may hold: bytes and (optionally) JSON values, counted piece by piece."""

    def __init__(self, cap: int, max_elements: int | None):
        self.cap, self.max_elements, self.size, self.elements = cap, max_elements, 0, 0

    def add(self, piece: bytes) -> None:
        self.size += len(piece)
        if self.size > self.cap:
            raise too_large("the decompressed body", self.cap, "SM_SEMIF_MAX_DECODED_BYTES")
        if self.max_elements is not None:
            self.elements += count_elements(piece)
            if self.elements > self.max_elements:
                raise too_many_elements(self.max_elements)


def _inflate(raw: bytes, wbits: int, limit: Limit, enc: str) -> bytes:
    """Inflate as a stream, stopping at `cap`. gzip may hold several members back to back (RFC 1952):
    all are decoded, the cap counting them together; bytes after a deflate stream are an error."""
    out, data = [], raw
    while True:
        d = zlib.decompressobj(wbits)
        try:
            while True:
                piece = d.decompress(data, INFLATE_STEP)
                limit.add(piece)
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


def _unzstd(raw: bytes, limit: Limit) -> bytes:
    """Decompress zstd frames one after another (a body may hold several), stopping at `cap`."""
    import zstandard

    out, rest = [], raw
    while rest:
        d = zstandard.ZstdDecompressor().decompressobj()
        i = 0
        try:
            while i < len(rest) and not d.eof:
                piece = d.decompress(rest[i: i + ZSTD_SLICE])
                i += ZSTD_SLICE
                limit.add(piece)
                out.append(piece)
        except zstandard.ZstdError as exc:
            raise HTTPProblem(400, "invalid_encoding", f"the body is not valid zstd data ({exc})") from None
        if not d.eof:
            raise HTTPProblem(400, "invalid_encoding", "the zstd body is truncated: send the complete frame")
        rest = d.unused_data + rest[i:]
    return b"".join(out)


STRUCTURAL = (b",", b"[", b"{")


def count_elements(data: bytes) -> int:
    """An upper bound on the JSON values in `data`: every value but the first follows a comma or
    opens an array/object (commas inside strings count too). bytes.count: ~3 ms per 16 MiB."""
    return sum(data.count(ch) for ch in STRUCTURAL)


def too_many_elements(limit: int) -> HTTPProblem:
    return HTTPProblem(413, "too_many_elements",
                       f"the body holds more than {limit} JSON values (commas, arrays and objects are counted before "
                       "parsing; SM_SEMIF_MAX_ELEMENTS): send fewer rows per request or a smaller state")
