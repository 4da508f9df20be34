//! The ledger conformance suite: every test runs on SQLite and on PostgreSQL
//! (`sqlite::<name>` / `postgres::<name>`).

mod common;

mod approvals;
mod batch_rows;
mod calls;
mod children;
mod connections;
mod cross_run;
mod deliveries;
mod differential;
mod events;
mod fanouts;
mod holds;
mod inbox;
mod open;
mod probes;
mod pure;
mod races;
mod rate;
mod resolve;
mod retention;
mod runs;
mod schedules;
mod search;
mod slots;
mod steps;
mod takeover;
mod tasks;
mod texts;
mod trace;
mod waits;
