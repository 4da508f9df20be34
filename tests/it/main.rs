//! End-to-end tests of the `flow` binary: one integration test binary, one module per
//! area (ripgrep's layout), real files and real processes.

mod api;
mod api_client;
mod api_doubt;
mod api_hostile;
mod api_stream;
mod approvals;
mod args;
mod chaos;
mod client;
mod crash;
mod daemon;
mod doubt_budget;
mod elicit;
mod events;
mod flapping;
mod follow_up;
mod gateway;
mod limits;
mod meta;
mod readme;
mod reconcile;
mod reconcile_console;
mod reconcile_kinds;
mod redrive;
mod retries;
mod runs;
mod search;
mod secrets;
mod sessions;
mod support;
mod tasks;
mod ui;
mod ui_scale;
mod validate;
mod views;
