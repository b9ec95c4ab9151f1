"""The face for files that are not a Delta table's own I/O: the checkpoint's own files
(``job.json``, the fingerprint, the plan, the local engine's translations, the cut log, Spark's
streaming checkpoint read as files), the markers of catalog entries (and the removal of the old snapshot directories),
the project's index of models, a CDC capture's landing directory (event files, schema files,
its state, the landing index), and directories removed whole.

Delta tables are read and written through :mod:`consistent_stream.delta`, except what table
maintenance does without a commit (:mod:`consistent_stream.sink.maintenance`: it reads a
table's log and deletes its expired files), which comes here. Everything else that touches
storage goes through here, so that a backend for another store (an object store's URIs) is one
module. Paths are local paths today, and three places still use a local path themselves:
the landing index maps its entries (``pa.memory_map``), maintenance reads a Delta checkpoint's
tombstones with pyarrow's Parquet reader, and the writer lock is an ``flock``
(:mod:`consistent_stream.sink.lock`).

Reads: :func:`read_text` and :func:`read_json` take a missing or unreadable file (and
:func:`read_json` a torn one) for no file, as a checkpoint file the run writes again;
:func:`read_bytes` raises, for a caller that must tell a missing file from one it cannot read.
Listings (:func:`list_dir`, :func:`walk`) take a missing directory for an empty one, as an
object store's listing of a prefix does.

Small files are replaced atomically (a temporary file renamed over the old one) and not
fsynced, as Spark's checkpoint files and delta-rs' commits are not: a lost write after a crash
is made again by the next run. Two writes fsync: a capture's landing files (:func:`replace_bytes`
with ``fsync``: the replication slot's confirmed position is advanced past what a file holds
once the write returns, so the file must be on disk by then), and the trimmed compact file of
Spark's file source log (:func:`write_bytes` with ``fsync`` before its rename: a crash of the
machine leaves the old file or the whole new one, and no run could write that log again).
"""
from __future__ import annotations

import json
import os
import shutil
from typing import Iterator, NamedTuple


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


def read_bytes(path: str) -> bytes:
    """The bytes of file ``path``. Raises FileNotFoundError when it does not exist, OSError
    when it cannot be read: unlike :func:`read_text`, a file that is there but unreadable is
    not taken for a missing one (a landing's event file, a Delta log entry maintenance reads,
    a checkpoint file the preflight checks name when damaged)."""
    with open(path, "rb") as f:
        return f.read()


def load_json(path: str):
    """The JSON value in file ``path`` (UTF-8). Raises FileNotFoundError when it does not
    exist, OSError when it cannot be read, ValueError when it is not JSON: for a caller that
    must tell a missing file from a damaged one (:func:`read_json` takes both for none)."""
    return json.loads(read_bytes(path).decode())


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


def replace_bytes(path: str, data: bytes, *, fsync: bool = False) -> None:
    """Write ``data`` (bytes or any bytes-like object) to ``path`` so that readers see the old
    file or all of the new one: written to the hidden temporary ``.<name>.<pid>.tmp`` beside it
    (a name landing readers skip, unique per writing process), then renamed over it. Its
    directory must exist. With ``fsync``, the temporary file is fsynced before the rename and
    the directory after it, so the new file is on disk when this returns (a capture's landing
    files, see the module docstring). Raises OSError; the temporary file is removed then."""
    d = os.path.dirname(path)
    tmp = os.path.join(d, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        write_bytes(tmp, data, fsync=fsync)
        os.replace(tmp, path)
    except OSError:
        try:
            remove(tmp)
        except OSError:
            pass
        raise
    if fsync:
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_bytes(path: str, data: bytes, *, fsync: bool = False) -> None:
    """Create or overwrite file ``path`` with ``data``, in place: a reader may see part of it,
    so it is for a temporary file the caller renames (:func:`rename`) once it has done what
    must come before the rename (the cut log sets the file's modification time; the file
    source log's trimming removes a checksum). With ``fsync``, the file is fsynced before this
    returns. Raises OSError."""
    with open(path, "wb") as f:
        f.write(data)
        if fsync:
            f.flush()
            os.fsync(f.fileno())


def rename(src: str, dst: str) -> None:
    """Rename file or directory ``src`` to ``dst`` atomically, replacing a file at ``dst`` (or
    an empty directory, for a directory). Raises OSError (FileNotFoundError when ``src`` is
    gone)."""
    os.replace(src, dst)


def exists(path: str) -> bool:
    """Whether a file or directory is at ``path``."""
    return os.path.exists(path)


def is_dir(path: str) -> bool:
    """Whether a directory is at ``path`` (False for a file, or nothing)."""
    return os.path.isdir(path)


def is_writable(path: str) -> bool:
    """Whether this process may create files in directory ``path`` (False when it does not
    exist): a reader that caches beside what it reads asks before it writes."""
    return os.access(path, os.W_OK)


class FileStat(NamedTuple):
    """What :func:`stat` tells of a file: its size in bytes and modification time (ns since
    the epoch)."""
    size: int
    mtime_ns: int


def stat(path: str) -> FileStat:
    """The size and modification time of file ``path``. Raises FileNotFoundError when it does
    not exist."""
    st = os.stat(path)
    return FileStat(st.st_size, st.st_mtime_ns)


def set_mtime_ns(path: str, mtime_ns: int) -> None:
    """Set the modification (and access) time of file ``path`` to ``mtime_ns`` (ns since the
    epoch): Spark's file source orders the files it reads by modification time, and the cut
    log sets it (:class:`consistent_stream.sources.stream.CutLog`). Raises OSError."""
    os.utime(path, ns=(mtime_ns, mtime_ns))


def list_dir(path: str) -> list[str]:
    """The names in directory ``path``, in no particular order; empty when it does not exist.
    Raises OSError when it cannot be read (or is not a directory)."""
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []


def walk(path: str) -> Iterator[tuple[str, list[str], list[str]]]:
    """The directories under ``path`` and itself, top down, as ``os.walk`` gives them:
    ``(directory, subdirectory names, file names)``; a caller may remove names from the
    subdirectory list to skip them. Nothing when ``path`` does not exist; a directory that
    cannot be read is skipped."""
    return os.walk(path)


def make_dirs(path: str, mode: int | None = None) -> None:
    """Create directory ``path`` and its missing parents; nothing when it exists. ``mode``:
    the permissions ``path`` is created with (before the umask; default 0o777), as
    ``os.makedirs``: its parents get the default. Raises OSError (FileExistsError when a file
    is at ``path``)."""
    os.makedirs(path, 0o777 if mode is None else mode, exist_ok=True)


def remove(path: str) -> bool:
    """Remove file ``path``; returns whether there was one (False: nothing to remove). Raises
    OSError when it cannot be removed."""
    try:
        os.remove(path)
    except FileNotFoundError:
        return False
    return True


def remove_tree(path: str, *, ignore_errors: bool = False) -> None:
    """Remove directory ``path`` and everything under it; nothing when it does not exist.
    Raises OSError when something under it cannot be removed, unless ``ignore_errors``: then
    what can be removed is, the rest is left, and nothing is raised (a scratch directory or a
    cache the next pass removes again)."""
    try:
        shutil.rmtree(path, ignore_errors=ignore_errors)
    except FileNotFoundError:
        pass
