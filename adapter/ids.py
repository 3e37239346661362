"""The id rule: what an option id, a question id or a /v1/systemone choice name may be, and when two
of them are one id in disguise.

An id is what an application receives and branches on, and what a person reads in the workbench and
the decision log, so one id must never pose as another:

- printable text only (no control, format or direction character: a newline, U+202E, a zero-width space);
- nothing invisible: no Unicode Default_Ignorable_Code_Point (the combining grapheme joiner U+034F,
  variation selectors U+FE00-FE0F and U+E0100-E01EF, Hangul fillers U+115F/U+1160/U+3164/U+FFA0, soft
  hyphen, tags), read from the `regex` library's Unicode tables, and no blank symbol (U+2800 BRAILLE
  PATTERN BLANK, which is a printable "symbol" that draws nothing): `bill` + U+034F + `ing` would
  otherwise be a second option that reads as `billing`;
- no leading or trailing whitespace (an id is returned exactly as sent: `" billing"` is refused, not
  silently turned into `"billing"`, which the client would then not find);
- at most MAX_ID_CHARS characters;
- letters from one script (Latin, Cyrillic, Greek, ...; Latin may join Han, kana or Hangul as Japanese,
  Chinese and Korean write): `pаypal` with a Cyrillic `а` is refused;
- within one question, no two ids with the same *skeleton*: equal after NFKC normalisation (`café`
  written precomposed or as `e` + U+0301, a fullwidth `Ａ`) and after mapping look-alike letters of
  other scripts to the Latin letter they resemble (Cyrillic `а` and Latin `a`).

Ids are compared by skeleton but kept as sent: a client gets back the very id it sent.
The look-alike table is the common Cyrillic and Greek homoglyphs of Latin letters (Unicode's
confusables.txt, the letters that render identically in common fonts), not the whole of UTS #39.
"""
from __future__ import annotations

import unicodedata

import regex

# invisible code points: Unicode's Default_Ignorable_Code_Point property (from `regex`, which tracks the
# current Unicode version) and the blank symbols that property leaves out (they are So, and draw nothing)
_BLANK_SYMBOLS = "\u2800"
_INVISIBLE = regex.compile(r"[\p{Default_Ignorable_Code_Point}" + _BLANK_SYMBOLS + "]")

MAX_ID_CHARS = 200

# Cyrillic and Greek letters that look like a Latin letter (UTS #39 confusables, the identical-looking ones)
_LOOKALIKE = {
    # Cyrillic
    "а": "a", "в": "b", "е": "e", "ё": "ë", "һ": "h", "і": "i", "ї": "ï", "ј": "j", "к": "k", "м": "m", "н": "h",
    "о": "o", "р": "p", "с": "c", "т": "t", "у": "y", "х": "x", "ѕ": "s", "ԁ": "d", "ԛ": "q", "ԝ": "w", "ӏ": "l",
    "ь": "b", "А": "A", "В": "B", "Е": "E", "Ё": "Ë", "З": "3", "І": "I", "Ї": "Ï", "Ј": "J", "К": "K", "М": "M",
    "Н": "H", "О": "O", "Р": "P", "С": "C", "Т": "T", "У": "Y", "Х": "X", "Ѕ": "S", "Ԁ": "D", "Ԛ": "Q", "Ԝ": "W",
    "Ү": "Y", "ү": "y", "Ӏ": "I",
    # Greek
    "α": "a", "ο": "o", "ρ": "p", "ν": "v", "τ": "t", "υ": "u", "ι": "i", "κ": "k", "χ": "x", "ϲ": "c", "ϳ": "j",
    "Α": "A", "Β": "B", "Ε": "E", "Ζ": "Z", "Η": "H", "Ι": "I", "Κ": "K", "Μ": "M", "Ν": "N", "Ο": "O", "Ρ": "P",
    "Τ": "T", "Υ": "Y", "Χ": "X", "Ϲ": "C",
}
# scripts that may share one id (UTS #39 "highly restrictive"): Latin with Han and kana, Hangul or Bopomofo
_ALLOWED_MIXES = ({"LATIN", "HAN", "HIRAGANA", "KATAKANA"}, {"LATIN", "HAN", "HANGUL"}, {"LATIN", "HAN", "BOPOMOFO"})
_SCRIPT_ALIASES = {"CJK": "HAN", "FULLWIDTH": "LATIN", "HALFWIDTH": "KATAKANA"}


def script(ch: str) -> str | None:
    """The script of a letter, from its Unicode name ('LATIN SMALL LETTER A' -> LATIN), None for
    anything but a letter (digits, punctuation, marks and spaces belong to every script)."""
    if not unicodedata.category(ch).startswith("L"):
        return None
    first = unicodedata.name(ch, "UNKNOWN").split(" ", 1)[0]
    return _SCRIPT_ALIASES.get(first, first)


def scripts(text: str) -> set[str]:
    return {s for s in map(script, unicodedata.normalize("NFKC", text)) if s is not None}


def skeleton(text: str) -> str:
    """What an id looks like: NFKC, then other scripts' look-alikes as the Latin letter (NFC again)."""
    mapped = "".join(_LOOKALIKE.get(ch, ch) for ch in unicodedata.normalize("NFKC", text))
    return unicodedata.normalize("NFC", mapped)


def unprintable(text: str) -> str | None:
    """Why `text` cannot be an id because of a character that is not printable, or None: a control or
    format character (a newline, a NUL, the right-to-left override U+202E, a zero-width space) lets one
    id pose as another in the UI and logs."""
    bad = next((ch for ch in text if not ch.isprintable()), None)
    if bad is None:
        found = _INVISIBLE.search(text)
        if found is None:
            return None
        ch = found.group()
        return (f"contains U+{ord(ch):04X} ({unicodedata.name(ch, 'an invisible character')}) at position "
                f"{found.start()}: ids must not hold invisible characters (Unicode default-ignorable code points, "
                "variation selectors, fillers, blank symbols), so that one id cannot pose as another")
    name = unicodedata.name(bad, "a control character")
    return (f"contains U+{ord(bad):04X} ({name}) at position {text.index(bad)}: ids must be printable text "
            "(no control, format or direction characters), so that one id cannot pose as another")


def id_problem(text: str) -> str | None:
    """Why `text` cannot be an id, or None (the rules in this module's docstring, one id at a time)."""
    if not text:
        return "is empty: ids must be non-empty"
    if len(text) > MAX_ID_CHARS:
        return f"is {len(text):,} characters long: ids are at most {MAX_ID_CHARS} characters"
    problem = unprintable(text)
    if problem:
        return problem
    if text != text.strip():
        return (f"{text!r} has leading or trailing whitespace: ids are returned exactly as sent, so send "
                f"{text.strip()!r}")
    found = scripts(text)
    if len(found) > 1 and not any(found <= mix for mix in _ALLOWED_MIXES):
        return (f"{text!r} mixes letters of the {', '.join(sorted(s.title() for s in found))} scripts: an id in one "
                "script cannot pose as another (e.g. a Cyrillic 'а' inside a Latin word)")
    return None


def collision(ids: list[str]) -> tuple[int, int] | None:
    """(earlier index, later index) of the first two ids with the same skeleton, else None."""
    seen: dict[str, int] = {}
    for i, text in enumerate(ids):
        key = skeleton(text)
        if key in seen:
            return seen[key], i
        seen[key] = i
    return None


def collision_message(first: str, second: str) -> str:
    if first == second:
        return f"duplicate id {second!r}: ids must be unique"
    how = ("the same text in another Unicode normal form (NFC vs NFD)"
           if unicodedata.normalize("NFC", first) == unicodedata.normalize("NFC", second)
           else "look-alike letters of another script, or another width")
    return (f"{second!r} looks like {first!r} ({how}; code points {_points(second)} vs {_points(first)}): "
            "ids must differ visibly - rename one")


def _points(text: str) -> str:
    return " ".join(f"U+{ord(c):04X}" for c in text[:12]) + (" ..." if len(text) > 12 else "")
