"""The loader's refusals of input that Python's own readers accept or choke on unhelpfully.

Each returns (or raises) a `DataError` naming the file, the line or record, and the fix, where the
reader alone would give a raw traceback or let the bad text through to fail later:

- a file that is not UTF-8 (the text reader's `UnicodeDecodeError` names a byte of a buffer, not
  a line);
- JSON that Python's parser refuses although it is well formed: nesting deeper than the
  recursion limit, or an integer of more than 4300 digits;
- a lone surrogate: the JSON escape `"\\ud800"` is valid JSON and decodes to a Python string that
  cannot be encoded as UTF-8, so a tokenizer, the results store or a terminal would fail on it
  later, far from the record that held it.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

from ..errors import DataError

_SURROGATE = re.compile("[\ud800-\udfff]")


def text_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of a UTF-8 file, read and decoded one line at a time.

    Lines end as in text mode (`\\n`, `\\r\\n` or `\\r`), and a leading BOM is dropped, but a line
    that is not UTF-8 raises a `DataError` naming it, and only once it is reached: the text-mode
    reader decodes whole buffers, so it failed on a bad line before yielding the good ones above.
    """
    n = 0
    with path.open("rb") as f:
        for raw in f:  # a UTF-8 multi-byte character never holds a newline byte
            try:
                text = raw.decode("utf-8-sig" if n == 0 else "utf-8")
            except UnicodeDecodeError as e:
                raise _bad_bytes(path, n + 1, raw, e) from None
            for piece in text.replace("\r\n", "\n").split("\r"):
                n += 1
                yield n, piece


def not_utf8(path: Path) -> DataError:
    """The error for a file that is not UTF-8, naming the first line that is not."""
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as e:
                return _bad_bytes(path, n, raw, e)
    return DataError(f"{path}: not valid UTF-8. Fix: save the file as UTF-8.")


def _bad_bytes(path: Path, n: int, raw: bytes, error: UnicodeDecodeError) -> DataError:
    return DataError(f"{path}, line {n}: not valid UTF-8 (byte {raw[error.start]:#04x} at byte {error.start + 1} "
                     f"of the line). Fix: save the file as UTF-8.")


def unparsable(loc: str, error: Exception) -> DataError:
    """Well-formed JSON that Python's parser refuses: nesting too deep, or a too-long integer."""
    if isinstance(error, RecursionError):
        return DataError(f"{loc}: JSON nested deeper than Python's parser allows (about "
                         f"{sys.getrecursionlimit()} levels). Fix: store the record with less nesting.")
    return DataError(f"{loc}: JSON that Python cannot read ({error}). Fix: store long numbers as strings.")


def utf8_text(value: str, loc: str, field: str) -> str:
    """`value`, refused with a `DataError` naming `loc` and `field` if it holds a lone surrogate."""
    bad = _SURROGATE.search(value)
    if bad:
        raise DataError(f"{loc}: field {field!r}: expected text encodable as UTF-8, found a lone surrogate "
                        f"{ascii(bad.group())[1:-1]} at character {bad.start()}. Fix: repair the text (a JSON "
                        f"escape \\uD800-\\uDFFF must be one half of a high-low surrogate pair).")
    return value
