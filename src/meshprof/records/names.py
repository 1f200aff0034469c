"""Names that become parts of paths: the ids of requests, captures and stacks answers.

Such an id is read from files anyone who can write the run directory may have written
(``RUN_DIR/requests/``), and a rank makes a folder of it (``RUN_DIR/captures/<id>/``): it must be
a name, never a path. One pattern says what a name is, for the file names and for the ids inside
the files, and it is checked when a record is read, not only when it is written."""

from __future__ import annotations

import re

from meshprof.records.codec import RecordError

MAX_ID_LENGTH = 128
"""The longest id (characters): a folder name every file system takes."""

ID_PATTERN = r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}"
"""An id: letters, digits, ``_``, ``-`` and ``.``, 1 to :data:`MAX_ID_LENGTH` characters, not
starting with a dot (so never ``.`` or ``..``, never a hidden file). No ``/``, ``\\``, NUL or
space: an id is one path component."""

_ID_RE = re.compile(ID_PATTERN)


def is_id(text: object) -> bool:
    """``text`` is a string that is an id (:data:`ID_PATTERN`)."""
    return isinstance(text, str) and _ID_RE.fullmatch(text) is not None


def check_id(text: str, where: str) -> str:
    """``text`` if it is an id; :class:`RecordError` naming ``where`` otherwise."""
    if not is_id(text):
        shown = repr(text) if len(repr(text)) <= 60 else repr(text)[:57] + "..."
        raise RecordError(
            f"{where}: {shown} is not an id (1 to {MAX_ID_LENGTH} letters, digits, '_', '-' "
            "or '.', not starting with '.')"
        )
    return text


__all__ = ["ID_PATTERN", "MAX_ID_LENGTH", "check_id", "is_id"]
