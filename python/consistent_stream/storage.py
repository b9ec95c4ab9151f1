"""The face for files that are not a Delta table's own I/O: the checkpoint's own files
(``job.json``, the fingerprint, the plan, the local engine's translations, the cut log, Spark's
streaming checkpoint read as files), the markers of catalog entries, the project's index of
models, a CDC capture's landing directory (event files, schema files, its state, the landing
index), table maintenance's reads of a Delta log and deletes of expired files, the one commit
file :mod:`consistent_stream.delta` reads back after a commit, and directories removed whole.

Every function takes a local path or an S3 URI (``s3://bucket/key``, see
:mod:`consistent_stream.location`): local paths go to the operating system, URIs to the
bucket's object store (obstore, the Python face of the ``object_store`` crate delta-rs
commits through). On an object store a "directory" is a key prefix: it exists while an
object is under it, :func:`make_dirs` has nothing to do, and a listing is one LIST request per
1,000 keys.

Reads: :func:`read_text` and :func:`read_json` take a missing or unreadable file (and
:func:`read_json` a torn one) for no file, as a checkpoint file the run writes again;
:func:`read_bytes` raises, for a caller that must tell a missing file from one it cannot read.
Listings (:func:`list_dir`, :func:`list_files`) take a missing directory for an empty one, as
an object store's listing of a prefix does.

Small files are replaced atomically (locally a temporary file renamed over the old one; on an
object store one PUT, which readers see whole or not at all) and not fsynced, as delta-rs'
commits are not: a lost write after a crash is made again by the next run. A capture's landing
files fsync (:func:`replace_bytes` with ``fsync``: the replication slot's confirmed position is
advanced past what a file holds once the write returns, so the file must be on disk by then; a
PUT has returned once the store holds the object). A rename on an object store is a copy and a
delete: the callers rename only hidden temporary files of their own, so a crash between the two
leaves a stray temporary file, never a torn one.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import threading
from contextlib import contextmanager
from typing import Iterator, NamedTuple

from . import local_cache, location
from .threads import at_once, begin

log = logging.getLogger("consistent_stream")


# ---- the object store's side ----------------------------------------------------------------
def _store(path: str):
    return location.object_store(path)


def _prefix(key: str) -> str:
    """The listing prefix of "directory" ``key`` ('' for the bucket's root)."""
    return key.rstrip("/") + "/" if key else ""


def _s3_get(path: str) -> bytes:
    import obstore
    store, key = _store(path)
    location.REQUESTS.add("GET", path)
    try:
        return bytes(obstore.get(store, key).bytes())
    except FileNotFoundError:
        raise
    except Exception as e:   # obstore's errors for refused credentials, a missing bucket, ...
        raise OSError(f"cannot read {path}: {e}") from e


def _s3_put(path: str, data) -> str | None:
    """PUT ``data`` at ``path``; returns its :func:`write tag <list_after>` (None without an ETag)."""
    import obstore
    store, key = _store(path)
    location.REQUESTS.add("PUT", path)
    data = bytes(data)
    try:
        return _tag(len(data), obstore.put(store, key, data).get("e_tag"))
    except Exception as e:
        raise OSError(f"cannot write {path}: {e}") from e


def _s3_head(path: str):
    import obstore
    store, key = _store(path)
    if key:
        location.REQUESTS.add("HEAD", path)
    try:
        return obstore.head(store, key) if key else None
    except FileNotFoundError:
        return None
    except Exception as e:
        raise OSError(f"cannot read {path}: {e}") from e


def _s3_keys(path: str) -> list[str]:
    """Every object key under "directory" ``path``."""
    import obstore
    store, key = _store(path)
    try:
        keys = [m["path"] for chunk in obstore.list(store, _prefix(key) or None) for m in chunk]
        location.REQUESTS.add("LIST", path, 1 + len(keys) // 1000)
        return keys
    except FileNotFoundError:
        return []
    except Exception as e:
        raise OSError(f"cannot list {path}: {e}") from e


# ---- reads ------------------------------------------------------------------------------------
def read_text(path: str) -> str | None:
    """The text of file ``path``, or None when it does not exist or cannot be read."""
    try:
        return read_bytes(path).decode()
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


_once = threading.local()


@contextmanager
def read_once_under(prefixes: str | tuple[str, ...], prefetch: tuple[str, ...] = ()):
    """Within the block, on this thread, each file under the directories ``prefixes`` (one or
    several) is read at most once, its absence included: a run asks its checkpoint's small
    files (the definition, the fingerprint, the plan, the query's record) in several checks,
    and holds the model's writer lock, so nothing else
    changes them meanwhile. Writes and removals under them through this module update what is
    remembered. (On an object store each read is a GET: the files named in ``prefetch``,
    paths under ``prefixes``, are read all at once from block entry on, one round trip for all,
    on the process's threads while the block goes on (a run opens its sources meanwhile); the
    block's first read, write or removal under ``prefixes`` waits for them, and so does the
    block's end. A file that cannot be read then is read again when asked. Where this machine kept a copy of
    them (:mod:`.local_cache`, kind ``files``: made when a file is read that way, and when
    :func:`replace_text` writes one), a directory's files are listed instead, one LIST, and only
    those whose write tag changed since the copy are read.)"""
    saved = getattr(_once, "scope", None)
    files: dict = {}
    under = tuple(p.rstrip("/") + "/" for p in ((prefixes,) if isinstance(prefixes, str) else prefixes))
    pending = None
    remote = [p for p in prefetch if location.is_remote(p) and p.startswith(under)]
    if len(remote) > 1:
        by_dir: dict[str, list[str]] = {}
        for p in remote:
            by_dir.setdefault(p.rsplit("/", 1)[0], []).append(p)
        groups = [ps for ps in by_dir.values() if len(ps) > 1 and local_cache.enabled()]
        singles = [[p] for ps in by_dir.values() if ps not in groups for p in ps]
        pending = begin(lambda: at_once(_prefetched, groups + singles, "read-once", limit=8), "read-once")
    _once.scope = (under, files, pending)
    try:
        yield
    finally:
        _scope()   # (no request of the block outlives it)
        _once.scope = saved


def _scope() -> tuple[tuple[str, ...], dict] | None:
    """This thread's :func:`read_once_under` scope, ``(prefixes, files read)``, once its
    prefetch is in (None outside one). A prefetch that failed leaves its files to be read when
    asked."""
    scope = getattr(_once, "scope", None)
    if scope is None:
        return None
    under, files, pending = scope
    if pending is not None:
        _once.scope = (under, files, None)
        try:
            for found in pending():
                files.update(found)
        except Exception as e:  # noqa: BLE001 (each file is read again when asked, which reports it)
            log.debug("reading %s ahead failed: %s", under, e)
    return under, files


def _prefetched(paths: list[str]) -> dict:
    """Files ``paths`` (on an object store): path -> bytes, None when absent; a path that
    cannot be read is left out (read again when asked). One path: a GET. Several of one
    directory: one LIST of it, and a GET of each whose write tag is not that of this
    machine's copy (each copy written again when read)."""
    def get(path: str) -> dict:
        try:
            return {path: _s3_get(path)}
        except FileNotFoundError:
            return {path: None}
        except OSError:
            return {}   # asked again later, where the error is reported
    if len(paths) == 1:
        return get(paths[0])
    directory = paths[0].rsplit("/", 1)[0]
    try:
        tags = dict(list_after(directory, "", tags=True))
    except OSError:
        return {}
    out: dict = {}
    stale: list[tuple[str, local_cache.Kept | None]] = []
    for p in paths:
        name = p.rsplit("/", 1)[1]
        if name not in tags:
            out[p] = None   # not there
            continue
        kept = local_cache.Kept("files", p) if tags[name] else None   # (no tag: a store without ETags)
        copy = kept.read() if kept is not None else None
        if copy is not None and copy.get("tag") == tags[name] and isinstance(copy.get("text"), str):
            out[p] = copy["text"].encode()
        else:
            stale.append((p, kept))
    for (p, kept), found in zip(stale, at_once(lambda pk: get(pk[0]), stale, "read-once", limit=8)):
        out.update(found)
        if kept is not None and found.get(p) is not None:
            try:
                kept.write({"tag": tags[p.rsplit("/", 1)[1]], "text": found[p].decode()})
            except UnicodeDecodeError:
                pass
    return out


def _remembered(path: str):
    scope = _scope()
    return scope[1] if scope is not None and path.startswith(scope[0]) else None


def _remember(path: str, data) -> None:
    files = _remembered(path)
    if files is not None:
        files[path] = data


def _forget_under(path: str) -> None:
    scope = _scope()
    if scope is not None:
        for p in [p for p in scope[1] if p == path or p.startswith(path.rstrip("/") + "/")]:
            del scope[1][p]


def read_bytes(path: str) -> bytes:
    """The bytes of file ``path``. Raises FileNotFoundError when it does not exist, OSError
    when it cannot be read: unlike :func:`read_text`, a file that is there but unreadable is
    not taken for a missing one (a landing's event file, a Delta log entry maintenance reads,
    a checkpoint file the preflight checks name when damaged). Read once within
    :func:`read_once_under`."""
    files = _remembered(path)
    if files is not None and path in files:
        if files[path] is None:
            raise FileNotFoundError(path)
        return files[path]
    try:
        if location.is_remote(path):
            data = _s3_get(path)
        else:
            with open(path, "rb") as f:
                data = f.read()
    except FileNotFoundError:
        _remember(path, None)
        raise
    _remember(path, data)
    return data


def read_many(paths: list[str], name: str = "read") -> list[bytes]:
    """The bytes of each of ``paths`` (:func:`read_bytes`), in order, read at once on up to 16
    threads (on an object store a GET each: one round trip for all). Raises as
    :func:`read_bytes` does, for the first path that fails."""
    return at_once(read_bytes, paths, name, limit=16)


def load_json(path: str):
    """The JSON value in file ``path`` (UTF-8). Raises FileNotFoundError when it does not
    exist, OSError when it cannot be read, ValueError when it is not JSON: for a caller that
    must tell a missing file from a damaged one (:func:`read_json` takes both for none)."""
    return json.loads(read_bytes(path).decode())


# ---- writes -----------------------------------------------------------------------------------
def replace_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically, creating its directory, unless the file already
    holds exactly ``text``: a run rewrites the checkpoint's ``job.json``, fingerprint and plan,
    which rarely change from run to run, and an unchanged file costs no write (a write can
    wait on the disk behind a batch's writes; on an object store a GET is cheaper than a
    PUT)."""
    if read_text(path) == text:
        return
    if location.is_remote(path):
        tag = _s3_put(path, text.encode())
        if tag and local_cache.enabled():   # this machine's copy, for the next run's listing to match
            local_cache.Kept("files", path).write({"tag": tag, "text": text})
    else:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
    _remember(path, text.encode())


def replace_bytes(path: str, data: bytes, *, fsync: bool = False) -> None:
    """Write ``data`` (bytes or any bytes-like object) to ``path`` so that readers see the old
    file or all of the new one. Locally: written to the hidden temporary ``.<name>.<pid>.tmp``
    beside it (a name landing readers skip, unique per writing process), then renamed over it;
    its directory must exist; with ``fsync``, the temporary file is fsynced before the rename
    and the directory after it, so the new file is on disk when this returns (a capture's
    landing files, see the module docstring). On an object store: one PUT. Raises OSError;
    the temporary file is removed then."""
    _forget_under(path)
    if location.is_remote(path):
        _s3_put(path, data)
        return
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
    """Create or overwrite file ``path`` with ``data``, in place: a local reader may see part
    of it, so it is for a file no reader looks for yet (a temporary file the caller renames,
    a data file a Delta commit adds later). On an object store: one PUT. With ``fsync``, a
    local file is fsynced before this returns. Raises OSError."""
    _forget_under(path)
    if location.is_remote(path):
        _s3_put(path, data)
        return
    with open(path, "wb") as f:
        f.write(data)
        if fsync:
            f.flush()
            os.fsync(f.fileno())


def create_bytes(path: str, data: bytes) -> str | None:
    """Create file ``path`` holding ``data`` unless a file is there already: the put-if-absent
    a Delta commit needs (two writers of one version: one wins, the other is told). On an
    object store one conditional PUT (``If-None-Match: *``); locally a hidden temporary file
    hard-linked to the name (atomic, and refused when the name exists; readers never see a
    partial file). Returns the file's :func:`write tag <list_after>` (None when the store
    answers the PUT without an ETag). Raises FileExistsError when the file exists, OSError
    otherwise."""
    _forget_under(path)
    if location.is_remote(path):
        import obstore
        from obstore.exceptions import AlreadyExistsError, PreconditionError
        store, key = _store(path)
        location.REQUESTS.add("PUT", path)
        try:
            put = obstore.put(store, key, bytes(data), mode="create")
        except (AlreadyExistsError, PreconditionError):
            raise FileExistsError(path) from None
        except Exception as e:
            raise OSError(f"cannot write {path}: {e}") from e
        _remember(path, bytes(data))
        return _tag(len(data), put.get("e_tag"))
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.tmp")
    write_bytes(tmp, data)
    try:
        os.link(tmp, path)
    finally:
        os.unlink(tmp)
    _remember(path, bytes(data))
    return _local_tag(path)


def _tag(size: int, etag: str | None) -> str | None:
    """An object's write tag: its size and ETag (None without an ETag)."""
    return None if not etag else f"{int(size)}:{etag.strip(chr(34))}"


def _local_tag(path: str) -> str:
    """A local file's write tag: its size and modification time in ns."""
    st = os.stat(path)
    return f"{st.st_size}:{st.st_mtime_ns}"


def rename(src: str, dst: str) -> None:
    """Rename file ``src`` to ``dst``, replacing a file at ``dst``: atomically on a local file
    system (a directory too, over an empty one), as a copy and a delete of the object on an
    object store. Raises OSError (FileNotFoundError when ``src`` is gone)."""
    _forget_under(src)
    _forget_under(dst)
    if location.is_remote(src):
        import obstore
        store, key = _store(src)
        _, dst_key = _store(dst)
        location.REQUESTS.add("COPY", dst)
        location.REQUESTS.add("DELETE", src)
        try:
            obstore.rename(store, key, dst_key)
        except FileNotFoundError:
            raise
        except Exception as e:
            raise OSError(f"cannot rename {src} to {dst}: {e}") from e
        return
    os.replace(src, dst)


# ---- what is there ----------------------------------------------------------------------------
def exists(path: str) -> bool:
    """Whether a file or directory is at ``path``."""
    if location.is_remote(path):
        return _s3_head(path) is not None or is_dir(path)
    return os.path.exists(path)


def is_dir(path: str) -> bool:
    """Whether a directory is at ``path`` (False for a file, or nothing; on an object store,
    whether an object is under the prefix)."""
    if location.is_remote(path):
        import obstore
        store, key = _store(path)
        try:
            return bool(next(iter(obstore.list(store, _prefix(key) or None, chunk_size=1)), None))
        except Exception as e:
            raise OSError(f"cannot list {path}: {e}") from e
    return os.path.isdir(path)


def is_writable(path: str) -> bool:
    """Whether this process may create files in directory ``path`` (False when it does not
    exist): a reader that caches beside what it reads asks before it writes. True for an
    object store's prefix (a refused PUT raises where it is made)."""
    if location.is_remote(path):
        return True
    return os.access(path, os.W_OK)


class FileStat(NamedTuple):
    """What :func:`stat` tells of a file: its size in bytes and modification time (ns since
    the epoch)."""
    size: int
    mtime_ns: int


def stat(path: str) -> FileStat:
    """The size and modification time of file ``path``. Raises FileNotFoundError when it does
    not exist."""
    if location.is_remote(path):
        meta = _s3_head(path)
        if meta is None:
            raise FileNotFoundError(path)
        return FileStat(int(meta["size"]), int(meta["last_modified"].timestamp() * 1000) * 1_000_000)
    st = os.stat(path)
    return FileStat(st.st_size, st.st_mtime_ns)


def list_dir(path: str) -> list[str]:
    """The names in directory ``path``, in no particular order; empty when it does not exist.
    Raises OSError when it cannot be read (or is not a directory)."""
    if location.is_remote(path):
        import obstore
        store, key = _store(path)
        prefix = _prefix(key)
        location.REQUESTS.add("LIST", path)
        try:
            out = obstore.list_with_delimiter(store, prefix or None)
        except FileNotFoundError:
            return []
        except Exception as e:
            raise OSError(f"cannot list {path}: {e}") from e
        dirs = [p.rstrip("/").rsplit("/", 1)[-1] for p in out["common_prefixes"]]
        # the directory's own marker (an S3A "dir/" object, listed as "dir") is not in it
        files = (m["path"] for m in out["objects"] if m["path"] != prefix.rstrip("/"))
        return dirs + [n for n in (p.rsplit("/", 1)[-1] for p in files) if n and n not in dirs]
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []


def list_after(path: str, name: str, *, tags: bool = False) -> list:
    """The names of the files directly in directory ``path`` that sort after ``name``, in
    order; empty when it does not exist. On an object store one LIST that starts after that
    key (a Delta log's commits after a known version, not the whole log). With ``tags``,
    ``(name, write tag)`` pairs: what tells one write of a file from another, the size and
    ETag on an object store (from the listing itself, None when the store gives no ETag),
    the size and modification time locally (one ``stat`` a file); :func:`create_bytes`
    returns the same tag for the file it writes. Raises OSError when it cannot be read."""
    if location.is_remote(path):
        import obstore
        store, key = _store(path)
        prefix = _prefix(key)
        try:
            found = [(m["path"][len(prefix):], _tag(m["size"], m.get("e_tag")))
                     for chunk in obstore.list(store, prefix or None, offset=prefix + name) for m in chunk]
            location.REQUESTS.add("LIST", path, 1 + len(found) // 1000)
        except FileNotFoundError:
            return []
        except Exception as e:
            raise OSError(f"cannot list {path}: {e}") from e
        found = sorted(f for f in found if f[0] and "/" not in f[0] and f[0] > name)
    else:
        try:
            names = sorted(n for n in os.listdir(path) if n > name and os.path.isfile(os.path.join(path, n)))
        except FileNotFoundError:
            return []
        if not tags:
            return names
        found = []
        for n in names:
            try:
                found.append((n, _local_tag(os.path.join(path, n))))
            except FileNotFoundError:
                continue   # removed while listed
    return found if tags else [n for n, _ in found]


def list_files(path: str, *, skip_dirs=lambda name: False) -> Iterator[tuple[str, FileStat]]:
    """Every file under directory ``path`` (recursively), as ``(path, FileStat)``, skipping the
    subdirectories whose name ``skip_dirs`` accepts and what is under them. Nothing when
    ``path`` does not exist. On an object store the sizes and times come from the listing
    itself (one LIST per 1,000 keys, no request per file); locally one ``stat`` per file. A
    file removed while listed is left out."""
    if not location.is_remote(path):
        for d, dirs, names in os.walk(path):
            dirs[:] = [n for n in dirs if not skip_dirs(n)]
            for n in names:
                p = os.path.join(d, n)
                try:
                    st = os.stat(p)
                except FileNotFoundError:
                    continue
                yield p, FileStat(st.st_size, st.st_mtime_ns)
        return
    import obstore
    store, key = _store(path)
    base = _prefix(key)
    listed = 0
    try:
        chunks = obstore.list(store, base or None)
        for chunk in chunks:
            listed += len(chunk)
            for m in chunk:
                rel = m["path"][len(base):]
                parts = rel.split("/")
                if not parts[-1] or any(skip_dirs(d) for d in parts[:-1]):
                    continue   # a directory marker, or under a skipped directory
                yield (location.join(path, rel),
                       FileStat(int(m["size"]), int(m["last_modified"].timestamp() * 1000) * 1_000_000))
    except FileNotFoundError:
        return
    except Exception as e:
        raise OSError(f"cannot list {path}: {e}") from e
    finally:
        location.REQUESTS.add("LIST", path, 1 + listed // 1000)


def make_dirs(path: str, mode: int | None = None) -> None:
    """Create directory ``path`` and its missing parents; nothing when it exists (nor on an
    object store, where a prefix needs no creating). ``mode``: the permissions ``path`` is
    created with (before the umask; default 0o777), as ``os.makedirs``: its parents get the
    default. Raises OSError (FileExistsError when a file is at ``path``)."""
    if location.is_remote(path):
        return
    os.makedirs(path, 0o777 if mode is None else mode, exist_ok=True)


def remove(path: str) -> bool:
    """Remove file ``path``; returns whether there was one (False: nothing to remove). Raises
    OSError when it cannot be removed."""
    _forget_under(path)
    if location.is_remote(path):
        if _s3_head(path) is None:
            return False
        import obstore
        store, key = _store(path)
        location.REQUESTS.add("DELETE", path)
        try:
            obstore.delete(store, key)
        except Exception as e:
            raise OSError(f"cannot remove {path}: {e}") from e
        return True
    try:
        os.remove(path)
    except FileNotFoundError:
        return False
    return True


def remove_many(paths: list[str]) -> int:
    """Remove the files ``paths`` (each known to exist, e.g. from a listing); returns how many
    were removed. On an object store one bulk DELETE per 1,000 keys of a bucket (S3's
    ``DeleteObjects``, through obstore), no HEAD before it; a store that refuses bulk deletes
    gets one DELETE per key. Locally one ``unlink`` each, a file already gone not counted.
    Raises OSError when one cannot be removed (the ones before it are gone)."""
    local = [p for p in paths if not location.is_remote(p)]
    removed = 0
    for p in local:
        _forget_under(p)
        try:
            os.remove(p)
            removed += 1
        except FileNotFoundError:
            pass
    by_store: dict = {}
    for p in paths:
        if location.is_remote(p):
            _forget_under(p)
            store, key = _store(p)
            by_store.setdefault(id(store), (store, p, []))[2].append(key)
    import obstore
    for store, first, keys in by_store.values():
        for i in range(0, len(keys), 1000):
            part = keys[i:i + 1000]
            location.REQUESTS.add("DELETE", first, 1)
            try:
                obstore.delete(store, part)
            except Exception as bulk:   # a store without DeleteObjects: one request a key
                log.info("bulk delete refused by the store (%s): deleting one key a request", bulk)
                location.REQUESTS.add("DELETE", first, len(part))
                for k in part:
                    try:
                        obstore.delete(store, k)
                    except FileNotFoundError:
                        continue
                    except Exception as e:
                        raise OSError(f"cannot remove {k} under {first}: {e}") from e
            removed += len(part)
    return removed


def remove_tree(path: str, *, ignore_errors: bool = False) -> None:
    """Remove directory ``path`` and everything under it; nothing when it does not exist.
    Raises OSError when something under it cannot be removed, unless ``ignore_errors``: then
    what can be removed is, the rest is left, and nothing is raised (a scratch directory or a
    cache the next pass removes again). On an object store: pyarrow's ``delete_dir``, one
    LIST per 1,000 keys and one bulk DELETE per 1,000 objects, the directory markers S3A
    writes (keys ending in ``/``, which obstore cannot name) included."""
    _forget_under(path)
    if location.is_remote(path):
        fs, key = location.pyarrow_filesystem(path)
        try:
            fs.delete_dir(key)
        except FileNotFoundError:
            pass
        except Exception as e:
            if "does not exist" in str(e) or "NoSuchKey" in str(e):
                return
            if not ignore_errors:
                raise OSError(f"cannot remove {path}: {e}") from e
        return
    try:
        shutil.rmtree(path, ignore_errors=ignore_errors)
    except FileNotFoundError:
        pass
