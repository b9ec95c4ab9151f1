"""The compact per-transaction bookkeeping a reader keeps for as long as it runs
(``sources/packed.py``, ``sources/tx_ids.py``, the Kafka reader's resume extents): the same
answers as the plain Python containers they replace, for ids of every shape a connector writes
and int64 values of every range."""
from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from consistent_stream.sources.kafka.extents import Extents
from consistent_stream.sources.packed import PackedInts
from consistent_stream.sources.tx_ids import TxIds, TxIdSet, decimal_id


class _Small(PackedInts):
    BLOCK = 8   # many sealed blocks from a few values

# PostgreSQL xids, GTIDs, leading zeros (not the same id as without them), huge numbers,
# the reader's own names for the snapshot and per-topic positions
ID = st.one_of(st.integers(0, 3000).map(str), st.integers(0, 10 ** 25).map(str),
               st.integers(0, 99).map(lambda i: f"0{i}"),
               st.from_regex(r"[0-9a-f]{8}-[0-9a-f]{4}:[0-9]{1,5}", fullmatch=True),
               st.sampled_from(["snapshot", "resume point", "t@12", "", "-5", "+7", "٣"]))


def test_decimal_id_is_the_canonical_text_of_an_int64_only():
    assert decimal_id("0") == 0 and decimal_id("123456") == 123456
    assert decimal_id("999999999999999999") == 999999999999999999
    for other in ("", "007", "-1", "+1", "1.0", " 1", "٣", "1" * 19, "abc"):
        assert decimal_id(other) is None


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(ID, max_size=60), st.data())
def test_tx_ids_give_back_what_was_appended_and_compress_keeps_the_order(ids, data):
    kept = TxIds(ids)
    assert len(kept) == len(ids) and [kept[i] for i in range(len(ids))] == ids
    if ids:
        assert kept[-1] == ids[-1]
    mask = np.array(data.draw(st.lists(st.booleans(), min_size=len(ids), max_size=len(ids))), dtype=bool)
    taken = kept.compress(mask)
    assert [taken[i] for i in range(len(taken))] == [i for i, m in zip(ids, mask) if m]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(ID, max_size=80), st.lists(ID, max_size=40))
def test_tx_id_set_answers_as_a_set_does(added, asked):
    s, ref = TxIdSet(), set()
    for i in added:
        s.add(i)
        ref.add(i)
        assert i in s and len(s) == len(ref)
    assert all((i in s) == (i in ref) for i in asked + added)
    assert s.intersection(asked + added) == ref & set(asked + added)


def test_tx_id_set_pages_dense_ids_of_any_range_and_keeps_sparse_ones_as_strings():
    """Dense xids anywhere (ranges further apart than 2**27, the old bitmap's span; 18 digits)
    take a bit each in pages; ids so sparse that a page each would cost more go to the set,
    and an id added to the set before its page existed is still found."""
    s = TxIdSet()
    dense = [str(x) for x in range(10, 10 + 3 * TxIdSet.PAGE)] + [str(x) for x in range(10 ** 17, 10 ** 17 + 5000)]
    for i in dense:
        s.add(i)
    assert all(i in s for i in dense) and len(s) == len(dense) and not s._other
    assert "9" not in s and str(10 ** 17 + 5000) not in s
    far = [str(2 ** 40 + k * 10 ** 7) for k in range(2000)]   # one id per page: sparse
    for i in far:
        s.add(i)
    assert all(i in s for i in far) and len(s) == len(dense) + len(far)
    # pages stay at least 1/64 full on average (8 bytes an id at most): the rest as strings
    assert (len(s._pages) - 1) * TxIdSet.PAGE <= 64 * s._in_pages and 0 < len(s._other) < len(far)
    s.add(far[0])   # already in: counted once
    assert len(s) == len(dense) + len(far)
    t = TxIdSet()
    for k in range(TxIdSet.FREE_PAGES):
        t.add(str(k * TxIdSet.PAGE))
    t.add("123456789012")           # no page for it: the set
    for k in range(TxIdSet.PAGE):   # its page made later by dense ids around it
        t.add(str(k))
    assert "123456789012" in t and "123456789012" in t._other and str(TxIdSet.PAGE - 1) in t


INT64 = st.integers(-2 ** 63, 2 ** 63 - 1)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.one_of(st.lists(INT64, max_size=60), st.lists(st.integers(-3, 300), max_size=60),
                 st.lists(st.integers(2 ** 62, 2 ** 63 - 1), max_size=30)), st.data())
def test_packed_ints_give_back_every_int64_appended_or_extended(values, data):
    """Whatever the spans of the blocks (one byte to eight, negative minimums, int64's ends):
    indexing, blocks, ranges and compress equal the list, appended one by one or extended
    from NumPy, sealed or not."""
    one, many = _Small(), _Small()
    for v in values:
        one.append(v)
    many.extend(np.array(values, dtype=np.int64))
    for col in (one, many):
        assert len(col) == len(values)
        assert [col[i] for i in range(len(values))] == values
        if values:
            assert col[-1] == values[-1]
        lo = data.draw(st.integers(0, len(values)))
        hi = data.draw(st.integers(lo, len(values)))
        assert col.numpy(lo, hi).tolist() == values[lo:hi]
        assert [x for _, a in col.blocks(lo, hi) for x in a.tolist()] == values[lo:hi]
        mask = np.array(data.draw(st.lists(st.booleans(), min_size=len(values), max_size=len(values))), dtype=bool)
        assert col.compress(mask).numpy().tolist() == [v for v, m in zip(values, mask) if m]
    col.settle()
    assert [col[i] for i in range(len(values))] == values
    assert all(np.dtype(t).itemsize <= 2 for _, _, t in _Small(range(0, 3000, 7))._blocks)   # small steps: small


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.integers(-5, 40), max_size=50).map(sorted), st.integers(-8, 45))
def test_packed_ints_searchsorted_counts_the_values_not_above(values, x):
    col = _Small(values)
    assert col.searchsorted(x) == sum(v <= x for v in values)


def _resume_by_hand(rows, position, offsets):
    """What the extents answer, from the appended rows themselves: the first offset per
    partition of the transactions after ``position``, and which transactions up to it have a
    record at or after ``offsets``."""
    after = [r for r in rows if r[0] > position]
    firsts = {}
    for r in after:
        for tp, f in r[3].items():
            firsts[tp] = min(firsts.get(tp, f), f)
    again = [i for i, r in enumerate(rows) if r[0] <= position
             and any(tp in offsets and last >= offsets[tp] for tp, last in r[4].items())]
    return firsts, again


def test_extents_answer_a_resume_point_as_the_rows_they_hold_do():
    """Random transactions over 7 partitions, each with records in a few of them (offsets far
    apart, as partitions' are): split, first_offsets and read_again equal what the rows
    themselves give, at every position asked, before and after keep(); ids and LSNs follow."""
    rnd = random.Random(5)
    parts = [("tx", 0)] + [(f"t{t}", p) for t in range(2) for p in range(3)]
    ext, rows = Extents(), []
    for i in range(3000):
        mine = [parts[0]] + rnd.sample(parts[1:], rnd.randint(0, 3))
        first = {tp: rnd.randint(0, 10 ** 12) for tp in mine}
        last = {tp: f + rnd.randint(0, 5) for tp, f in first.items()}
        tx_id = rnd.choice([str(700 + i), f"gtid-{i}"])
        lsn = rnd.choice([None, 10 * i])
        ext.append(2 * i + 1, tx_id, lsn, first, last)
        rows.append((2 * i + 1, tx_id, -1 if lsn is None else lsn, first, last))

    def check(rows):
        assert ext.position.numpy().tolist() == [r[0] for r in rows]
        assert [ext.ids[i] for i in range(len(ext.ids))] == [r[1] for r in rows]
        assert ext.lsn.numpy().tolist() == [r[2] for r in rows]
        for position in [0] + [rnd.choice(rows)[0] + rnd.choice([0, 1]) for _ in range(5)] + [10 ** 9]:
            k, e = ext.split(position)
            assert k == sum(r[0] <= position for r in rows)
            assert e == sum(len(r[3]) for r in rows[:k])
            offsets = {tp: rnd.randint(0, 10 ** 12) for tp in rnd.sample(parts, 4)}
            firsts, again = _resume_by_hand(rows, position, offsets)
            assert ext.first_offsets(e) == firsts
            assert ext.read_again(k, e, offsets).tolist() == again
    check(rows)
    mask = np.array([rnd.random() < 0.4 for _ in rows])
    ext.keep(mask)
    rows = [r for r, m in zip(rows, mask) if m]
    check(rows)
    ext.append(10 ** 8, "42", 7, {parts[0]: 5}, {parts[0]: 9})   # appended after a keep
    rows.append((10 ** 8, "42", 7, {parts[0]: 5}, {parts[0]: 9}))
    check(rows)
    ext.keep(np.zeros(len(ext.position), dtype=bool))
    assert len(ext.position) == 0 and ext.split(10 ** 9) == (0, 0) and ext.first_offsets(0) == {}


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(-3, 3)), max_size=80), st.integers(-2, 45))
def test_net_weights_sum_a_dropped_chunks_weights_up_to_and_past_a_position(rows, position):
    """A chunk whose images were dropped keeps each position's summed weight (zero sums left
    out): the sums up to and past any position are those of the rows it was built from."""
    import pyarrow as pa
    from consistent_stream.sources.debezium.source import NetWeights
    t = pa.table({"__pos": pa.array([p for p, _ in rows], pa.int64()),
                  "__weight": pa.array([w for _, w in rows], pa.int64())})
    net = NetWeights(t)
    assert net.upto(position) == sum(w for p, w in rows if p <= position)
    assert net.past(position) == sum(w for p, w in rows if p > position)
    assert 0 not in net.weight.numpy().tolist()
    assert net.pos.numpy().tolist() == sorted({p for p, _ in rows if sum(w for q, w in rows if q == p)})


def test_tx_log_slices_and_iterates_as_it_indexes():
    """The transaction log's slices (decoded a block at a time) and iteration give the TxInfo
    that indexing gives, across sealed blocks and the growing tail, ids of any shape."""
    from consistent_stream.sources.landing_index import TxInfo, TxLog
    rnd = random.Random(3)
    txs = [TxInfo(3 * i + 1, rnd.choice([str(500 + i), f"gtid-{i}", "snapshot"]), 1_700_000_000_000 + 7 * i,
                  rnd.choice([{"a": 1}, {"a": 2, "b": 1}, {}]), rnd.choice(["f1", "f2"]), i, i == 0)
           for i in range(2 * PackedInts.BLOCK + 123)]
    log = TxLog(txs)
    assert list(log) == txs and log[:] == txs
    for lo, hi in [(0, 1), (5, 4100), (4095, 4097), (8000, len(txs)), (10, 10)]:
        assert log[lo:hi] == txs[lo:hi] == [log[i] for i in range(lo, hi)]
    assert log[::1000] == txs[::1000] and log[-1] == txs[-1]
    assert log.bisect(0) == 0 and log.bisect(4) == 2 and log.bisect(10 ** 9) == len(txs)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=40), st.data())
def test_chunk_files_give_back_every_row_in_position_order_in_few_files(sizes, data):
    """A reader's chunks copied to disk (``sources/chunk_files.py``), written one by one as a
    long-running reader drops them: any range of positions reads back exactly the rows in it,
    in position order, and merging keeps the small files few (about log2 of the writes)."""
    import os
    import pyarrow as pa
    import pyarrow.parquet as pq
    from consistent_stream.sources import chunk_files
    from consistent_stream.sources.debezium.events import POS, WEIGHT
    files, rows, pos = chunk_files.ChunkFiles(frozen_bytes=1 << 30), [], 0
    for n in sizes:
        t = pa.table({"id": pa.array(range(pos, pos + n), pa.int64()), "s": [f"r{i}" for i in range(n)],
                      POS: pa.array(range(pos + 1, pos + n + 1), pa.int64()), WEIGHT: pa.array([1] * n, pa.int64())})
        files.write({"public.a": t})
        rows += t.select(["id", "s", WEIGHT]).to_pylist()
        pos += n
    assert len(os.listdir(files.directory)) <= len(sizes).bit_length() + 1
    after = data.draw(st.integers(-1, pos))
    upto = data.draw(st.integers(after, pos))
    got = [r for t in files.read("public.a", after, upto, ["id", "s"]) for r in t.to_pylist()]
    assert got == rows[max(after, 0):max(upto, 0)]   # row i is at position i + 1 (no negative slicing)
    assert files.paths("public.b", pos) == [] and (upto < 1 or files.paths("public.a", upto))
    before, pinned = files.paths("public.a", pos), files.pin("public.a", pos)
    every = pa.Table.from_pylist([{**r, POS: pos + 1 + i} for i, r in enumerate(rows)], t.schema)
    files.write({"public.a": every})   # larger than every file before it: they all merge into one
    assert not any(os.path.exists(p) for p in before) and len(files.paths("public.a", 2 * pos)) == 1
    assert [r for p in pinned for r in pq.read_table(p, columns=["id", "s", WEIGHT]).to_pylist()] == rows
    d = files.directory
    files.close()
    assert not os.path.exists(d)
