-- Concurrency slots (issue 53, flow control; ledger/src/slots.rs). A tool declared with
-- `concurrency: N` lets at most N of its calls be between the outbound mark and their
-- outcome, across every daemon and host. A slot is not a counter that every write must
-- keep in step: it is the call row itself. `slot` names the limit the call counts
-- against (`<workflow>/<tool>`), written by the same statement as the outbound mark, and
-- a call holds its slot while its status is `outbound` or `in_doubt` — so a crash, a
-- takeover or a resolution frees or keeps it by the status alone, and nothing can leak.
-- A call refused a slot keeps `slot` and records when it first waited
-- (`slot_waiting_since`): the waiters are served oldest first. An operator releases the
-- slot of a call in doubt by clearing `slot` (`flow release-slot`).
--
-- `waiting` says, in words, why a claimed call was let go unsent and waits (a slot, the
-- rate limit, a downstream's `Retry-After`), for `flow show`, the API and the console;
-- the outbound mark clears it.
--
-- A downstream's `Retry-After` on a tool under flow control is remembered for every
-- daemon as a `rate_counters` row of kind `hold_off` (`window_start` 0, `count` the
-- time it ends, ms): the same table that counts the tool's rate, no new one.
ALTER TABLE tool_calls ADD COLUMN slot TEXT;
ALTER TABLE tool_calls ADD COLUMN slot_waiting_since BIGINT;
ALTER TABLE tool_calls ADD COLUMN waiting TEXT;
CREATE INDEX tool_calls_by_slot ON tool_calls (tenant, workspace, slot, status)
    WHERE slot IS NOT NULL;
