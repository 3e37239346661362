"""Page state keys: every session-state and widget key a page uses is its page's prefix plus a declared name,
so no page hand-writes a key another page could collide with, a misspelt name is a mypy error (not a new key
made silently), and a test can list a page's keys by its prefix. The declarations are app/ui/keys.py.

    class CalibrateKeys(PageKeys):
        run = Key()
    keys = CalibrateKeys("cal")
    keys.run            # "cal_run"
    keys("map", 3)      # "cal_map_3" (a key per item)

The separator defaults to "_" so existing keys (which the browser and AppTest tests find widgets by) keep
their exact strings."""
from __future__ import annotations

from dataclasses import dataclass
from typing import overload


class Key:
    """One declared key of a page: read on the page's keys, it is "<prefix><sep><name>"."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, keys: None, owner: type) -> Key: ...
    @overload
    def __get__(self, keys: PageKeys, owner: type) -> str: ...

    def __get__(self, keys: PageKeys | None, owner: type) -> Key | str:
        return self if keys is None else f"{keys.prefix}{keys.sep}{self.name}"


@dataclass(frozen=True)
class PageKeys:
    """The key namespace of one page; a subclass declares its names (`name = Key()`)."""

    prefix: str
    sep: str = "_"

    def __call__(self, *parts: object) -> str:
        """A key built from several parts, e.g. one per policy or per row."""
        return self.sep.join([self.prefix, *(str(p) for p in parts)])

    def owns(self, key: str) -> bool:
        """Whether `key` is one of this page's."""
        return key.startswith(self.prefix + self.sep)

    @classmethod
    def declared(cls) -> list[str]:
        """The names this page declares (sorted)."""
        return sorted(n for k in cls.__mro__ for n, v in vars(k).items() if isinstance(v, Key))
