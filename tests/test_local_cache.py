"""The data files this machine keeps (``local_cache.DATA_FILES``, kind ``data-files``): read
back only for the URI and size they were kept for and only when framed as Parquet, bounded by
``CONSISTENT_STREAM_DATA_CACHE_MB`` with the least recently used out first, and none kept when
the bound is 0 or the local cache is off; and the small JSON documents (``local_cache.Kept``)
and their journals read back as written. (What a run reads from them on an object store:
``test_object_store.py``.)"""
from __future__ import annotations

import io
import os
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from consistent_stream import local_cache
from consistent_stream.errors import ConfigError


@pytest.fixture
def kept(tmp_path, monkeypatch):
    monkeypatch.setenv(local_cache.ENV_DIR, str(tmp_path))
    monkeypatch.delenv(local_cache.DATA_ENV, raising=False)
    monkeypatch.delenv(local_cache.ENV_SWITCH, raising=False)
    return local_cache.KeptDataFiles()


def _parquet(rows: int) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.table({"k": pa.array(range(rows), pa.int64())}), buf, compression="none")
    return buf.getvalue()


def test_a_kept_file_is_read_back_for_its_uri_and_size_only(kept):
    data = _parquet(10)
    kept.put("s3://b/t/part-1.parquet", data)
    assert kept.get("s3://b/t/part-1.parquet", len(data)) == data
    assert kept.get("s3://b/t/part-1.parquet", len(data) + 1) is None     # another size: another file
    assert kept.get("s3://b/t/part-2.parquet", len(data)) is None
    assert kept.get("s3://b/t/part-1.parquet", 0) is None


def test_a_kept_file_that_is_not_whole_parquet_is_dropped(kept):
    data = _parquet(10)
    kept.put("s3://b/t/a.parquet", data)
    (f,) = local_cache.directory("data-files").iterdir()
    f.write_bytes(b"XXXX" + data[4:])                                     # same size, not framed as Parquet
    assert kept.get("s3://b/t/a.parquet", len(data)) is None
    assert not f.exists()


def test_the_least_recently_used_files_go_first_when_the_bound_is_passed(kept, monkeypatch):
    monkeypatch.setenv(local_cache.DATA_ENV, "1")                          # 1 MiB: a file of up to 256 KiB is kept
    data = [_parquet(24_000 + i) for i in range(5)]                        # about 232 KiB each
    assert all(3 << 18 < 4 * len(d) <= 1 << 20 for d in data)   # each over 3/16 MiB, at most 1/4
    for i, d in enumerate(data[:4]):                                       # 4 x 240 KiB: under 1 MiB
        kept.put(f"s3://b/{i}.parquet", d)
    now = time.time()
    ages = {data[0]: 10, data[1]: 100, data[2]: 90, data[3]: 5}           # 0 used lately, 1 and 2 long ago
    for f in local_cache.directory("data-files").iterdir():
        os.utime(f, (now - ages[f.read_bytes()], now - ages[f.read_bytes()]))
    assert kept.get("s3://b/0.parquet", len(data[0])) == data[0]          # a use: the newest now
    kept.put("s3://b/4.parquet", data[4])                                  # past 1 MiB: out to 3/4 of it
    left = [f.read_bytes() for f in local_cache.directory("data-files").iterdir()]
    assert sorted(left) == sorted([data[0], data[3], data[4]])
    assert sum(len(b) for b in left) <= (1 << 20) * 3 // 4


def test_nothing_is_kept_at_a_bound_of_0_off_or_for_a_file_over_a_quarter_of_it(kept, monkeypatch):
    data = _parquet(10)
    monkeypatch.setenv(local_cache.DATA_ENV, "0")
    kept.put("s3://b/a.parquet", data)
    monkeypatch.delenv(local_cache.DATA_ENV)
    assert kept.get("s3://b/a.parquet", len(data)) is None
    monkeypatch.setenv(local_cache.ENV_SWITCH, "off")
    kept.put("s3://b/a.parquet", data)
    monkeypatch.delenv(local_cache.ENV_SWITCH)
    assert kept.get("s3://b/a.parquet", len(data)) is None
    monkeypatch.setenv(local_cache.DATA_ENV, "1")
    big = _parquet(40_000)                                                 # over 256 KiB
    kept.put("s3://b/big.parquet", big)
    assert len(big) > 256 << 10 and kept.get("s3://b/big.parquet", len(big)) is None


@pytest.mark.parametrize("raw", ["-1", "2.5", "lots"])
def test_a_bad_bound_names_the_variable(kept, monkeypatch, raw):
    monkeypatch.setenv(local_cache.DATA_ENV, raw)
    with pytest.raises(ConfigError, match=local_cache.DATA_ENV):
        local_cache.data_cache_bytes()


def test_a_kept_key_file_that_does_not_decode_is_dropped(tmp_path, monkeypatch):
    """A target file's kept key columns (``DATA_KEYS``, Arrow IPC) framed whole but damaged
    inside read as none kept, and are removed (the probe decodes the key column again)."""
    from consistent_stream.delta import files
    monkeypatch.setenv(local_cache.ENV_DIR, str(tmp_path))
    monkeypatch.delenv(local_cache.DATA_ENV, raising=False)
    keys = pa.table({"k": pa.array(range(1000), pa.int64())})
    files.keep_keys("s3://b/t/part-1.parquet", 123, keys)
    assert files.kept_keys("s3://b/t/part-1.parquet", 123, keys.schema).equals(keys)
    [f] = (tmp_path / "data-keys").iterdir()
    data = bytearray(f.read_bytes())
    data[8:-8] = bytes(len(data) - 16)
    f.write_bytes(bytes(data))
    assert files.kept_keys("s3://b/t/part-1.parquet", 123, keys.schema) is None
    assert not f.exists()


def test_a_document_and_its_journal_read_back_as_written_nan_and_big_integers_included(tmp_path, monkeypatch):
    # (documents are parsed by orjson, which refuses NaN and integers past 64 bits: those
    # documents and journal lines read as the standard parser reads them, not as missing)
    import math
    monkeypatch.setenv(local_cache.ENV_DIR, str(tmp_path))
    monkeypatch.delenv(local_cache.ENV_SWITCH, raising=False)
    doc = local_cache.Kept("files", "s3://b/t/doc")
    written = {"text": "é ☃", "n": 2 ** 70, "x": float("nan"), "list": [1, 2.5, None, True]}
    assert doc.write(written) is not None
    back = doc.read()
    assert math.isnan(back.pop("x")) and back == {k: v for k, v in written.items() if k != "x"}
    doc.append({"version": 1, "big": -(2 ** 65)})
    doc.append({"version": 2, "y": float("inf")})
    with open(doc.journal, "a") as f:
        f.write('{"version": 3, "torn')   # a line a crash tore: the journal ends before it
    assert doc.read_journal() == [{"version": 1, "big": -(2 ** 65)}, {"version": 2, "y": float("inf")}]
