"""Debezium PostgreSQL change events and transaction metadata as its JSON converter writes them
(the shapes measured on Debezium 3.6.1.Final with Kafka Connect 4.1.1), for tests that put
exact sequences on real Kafka topics: duplicates, a missing END, malformed values. Snapshot
reads (op r) carry the snapshot transaction's ``txId`` and ``lsn``, the same on every one of
them, as the connector writes them.

Tables here have two columns: ``id`` int32 (the key) and ``v`` int64."""
from __future__ import annotations

import json

SCHEMA_FIELDS = [{"type": "int32", "optional": False, "field": "id"},
                 {"type": "int64", "optional": True, "field": "v"}]


def _envelope(table: str) -> dict:
    row = {"type": "struct", "fields": SCHEMA_FIELDS, "optional": True, "name": f"x.{table}.Value"}
    return {"type": "struct", "optional": False, "name": f"x.{table}.Envelope", "version": 2, "fields": [
        {**row, "field": "before"}, {**row, "field": "after"},
        {"type": "struct", "field": "source", "optional": False, "fields": []},
        {"type": "string", "optional": False, "field": "op"},
        {"type": "int64", "optional": True, "field": "ts_ms"},
        {"type": "struct", "optional": True, "field": "transaction", "fields": []}]}


class Events:
    """Makes the values of one connector (topic prefix ``prefix``, schema ``public``)."""

    def __init__(self, prefix: str, schemas: bool = True):
        self.prefix, self.schemas = prefix, schemas
        self.lsn = 1000
        self.xid = 500
        self.total = 0
        self.snapshot_xid, self.snapshot_lsn = 499, 996   # the snapshot transaction's: on every op r event

    def repeat_snapshot(self) -> None:
        """The connector takes its snapshot again (a new snapshot transaction, a later LSN)."""
        self.xid += 1
        self.lsn += 8
        self.snapshot_xid, self.snapshot_lsn = self.xid, self.lsn

    def topic(self, table: str) -> str:
        return f"{self.prefix}.public.{table}"

    @property
    def tx_topic(self) -> str:
        return f"{self.prefix}.transaction"

    def _wrap(self, table: str, payload: dict) -> bytes:
        if self.schemas:
            return json.dumps({"schema": _envelope(table), "payload": payload}).encode()
        return json.dumps(payload).encode()

    def change(self, table: str, op: str, before: dict | None, after: dict | None, tx: str | None,
               snapshot: str = "false", order: int | None = None, table_order: int = 1) -> bytes:
        if op == "r":
            xid, lsn = self.snapshot_xid, self.snapshot_lsn
        else:
            self.lsn += 8
            xid, lsn = self.xid, self.lsn
        source = {"version": "3.6.1.Final", "connector": "postgresql", "name": self.prefix, "db": "postgres",
                  "schema": "public", "table": table, "txId": xid, "lsn": lsn, "snapshot": snapshot,
                  "ts_ms": 1764000000000}
        txb = None
        if tx is not None:
            if order is None:
                self.total += 1
                order = self.total
            txb = {"id": tx, "total_order": order, "data_collection_order": table_order}
        return self._wrap(table, {"before": before, "after": after, "source": source, "op": op,
                                  "ts_ms": 1764000000000, "transaction": txb})

    def begin(self) -> tuple[str, bytes]:
        self.xid += 1
        self.total = 0
        tx = f"{self.xid}:{self.lsn + 4}"
        return tx, json.dumps({"status": "BEGIN", "id": tx, "event_count": None, "data_collections": None,
                               "ts_ms": 1764000000000}).encode()

    def end(self, tx: str, counts: dict[str, int]) -> bytes:
        return json.dumps({"status": "END", "id": tx, "event_count": sum(counts.values()),
                           "data_collections": [{"data_collection": f"public.{t}", "event_count": n}
                                                for t, n in counts.items()],
                           "ts_ms": 1764000000000}).encode()
