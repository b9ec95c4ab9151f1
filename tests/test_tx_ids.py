"""The compact per-transaction bookkeeping a reader keeps for as long as it runs
(``sources/tx_ids.py``, the Kafka reader's resume extents): the same answers as the plain
Python containers they replace, for ids of every shape a connector writes."""
from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from consistent_stream.sources.kafka import _Extents
from consistent_stream.sources.tx_ids import TxIds, TxIdSet, decimal_id

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
def test_tx_ids_give_back_what_was_appended_and_take_keeps_the_order(ids, data):
    kept = TxIds(ids)
    assert len(kept) == len(ids) and [kept[i] for i in range(len(ids))] == ids
    if ids:
        assert kept[-1] == ids[-1]
    mask = np.array(data.draw(st.lists(st.booleans(), min_size=len(ids), max_size=len(ids))), dtype=bool)
    taken = kept.take(np.flatnonzero(mask))
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


def test_tx_id_set_beyond_its_bitmap_span_and_below_its_first_id():
    s = TxIdSet(["1000"])
    far, below = str(1000 + TxIdSet.SPAN), "999"
    assert far not in s and below not in s
    s.add(far)
    s.add(below)
    assert far in s and below in s and "1001" not in s and len(s) == 3
    assert len(s._bits) <= 1 + 1000 // 8 + 1   # the far id went to the set, not a 16 MB bitmap


def test_extents_keep_the_offsets_of_the_dense_columns_they_replace():
    """Random transactions over 7 partitions, each with records in a few of them: columns()
    equals the per-partition dense columns built from the same appends, before and after
    keep(); ids and LSNs follow."""
    rnd = random.Random(5)
    parts = [("tx", 0)] + [(f"t{t}", p) for t in range(2) for p in range(3)]
    ext, rows = _Extents(), []
    for i in range(500):
        mine = [parts[0]] + rnd.sample(parts[1:], rnd.randint(0, 3))
        first = {tp: rnd.randint(0, 10 ** 12) for tp in mine}
        last = {tp: f + rnd.randint(0, 5) for tp, f in first.items()}
        tx_id = rnd.choice([str(700 + i), f"gtid-{i}"])
        lsn = rnd.choice([None, 10 * i])
        ext.append(i + 1, tx_id, lsn, first, last)
        rows.append((i + 1, tx_id, -1 if lsn is None else lsn, first, last))

    def check(rows):
        pos, firsts, lasts = ext.columns()
        assert pos.tolist() == [r[0] for r in rows]
        assert [ext.ids[i] for i in range(len(ext.ids))] == [r[1] for r in rows]
        assert list(ext.lsn) == [r[2] for r in rows]
        for tp in parts:
            if any(tp in r[3] for r in rows):
                assert firsts[tp].tolist() == [r[3].get(tp, -1) for r in rows]
                assert lasts[tp].tolist() == [r[4].get(tp, -1) for r in rows]
    check(rows)
    mask = np.array([rnd.random() < 0.4 for _ in rows])
    ext.keep(mask)
    check([r for r, m in zip(rows, mask) if m])
    ext.keep(np.zeros(len(ext.position), dtype=bool))
    pos, firsts, _ = ext.columns()
    assert pos.size == 0 and all(a.size == 0 for a in firsts.values())
