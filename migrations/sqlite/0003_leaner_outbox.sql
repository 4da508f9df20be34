-- One index fewer on the outbox, as on PostgreSQL (see migrations/postgres/0003): the
-- dispatcher reads `outbox_by_txid`, and the queries ordered by seq alone walk the
-- table's own rowid order.
DROP INDEX IF EXISTS outbox_due;
