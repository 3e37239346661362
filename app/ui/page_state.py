"""Page state keys: every session-state and widget key a page uses is its page's prefix plus a name, so no
page hand-writes a key another page could collide with, and a test can list a page's keys by its prefix.

    keys = PageKeys("cal")
    keys.run            # "cal_run"
    keys("map", 3)      # "cal_map_3" (a key per item)

The separator defaults to "_" so existing keys (which the browser and AppTest tests find widgets by) keep
their exact strings."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PageKeys:
    """The key namespace of one page."""

    prefix: str
    sep: str = "_"

    def __getattr__(self, name: str) -> str:
        if name.startswith("__"):  # copy/pickle probe dunders: not keys
            raise AttributeError(name)
        return f"{self.prefix}{self.sep}{name}"

    def __call__(self, *parts: object) -> str:
        """A key built from several parts, e.g. one per policy or per row."""
        return self.sep.join([self.prefix, *(str(p) for p in parts)])

    def owns(self, key: str) -> bool:
        """Whether `key` is one of this page's."""
        return key.startswith(self.prefix + self.sep)
