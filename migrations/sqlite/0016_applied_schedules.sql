-- Schedules a workflow file carries (`flow schedules apply FILE`) live in `schedules`
-- like flow.toml's, told apart by `applied_from` in their definition: no new column.
-- This migration changes nothing, on purpose: a binary from before it would prune
-- those schedules at its next start (its flow.toml does not name them), and a binary
-- refuses a ledger that has a migration it does not know. So every flow that can see
-- an applied schedule knows not to remove it. Upgrade every daemon before the first
-- `flow schedules apply`.
SELECT 1;
