"""The face for files that are not a Delta table: the checkpoint's own files (``job.json``,
the fingerprint, the plan, the local engine's translations, the cut log), markers beside
catalog entries, and directories removed whole.

Delta tables are read and written through :mod:`consistent_stream.delta` only; everything
else that touches storage goes through here, so that a backend for another store (an object
store's URIs) is one module. Paths are local paths today.

Small files are replaced atomically (a temporary file renamed over the old one) and not
fsynced, as Spark's checkpoint files and delta-rs' commits are not: a lost write after a crash
is made again by the next run.
"""
from __future__ import annotations

import json
import os
import shutil


def read_text(path: str) -> str | None:
    """The text of file ``path``, or None when it does not exist or cannot be read."""
    try:
        with open(path) as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def read_json(path: str):
    """The JSON value in file ``path``, or None when the file is missing, unreadable or not
    JSON (a torn write reads as missing)."""
    text = read_text(path)
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def replace_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically (a temporary file renamed over it), creating its
    directory, unless the file already holds exactly ``text``: a run rewrites the checkpoint's
    ``job.json``, fingerprint and plan, which rarely change from run to run, and an unchanged
    file costs no write (a write can wait on the disk behind a batch's writes)."""
    if read_text(path) == text:
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def exists(path: str) -> bool:
    """Whether a file or directory is at ``path``."""
    return os.path.exists(path)


def remove_tree(path: str) -> None:
    """Remove directory ``path`` and everything under it; nothing when it does not exist.
    Raises OSError when something under it cannot be removed."""
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        pass
