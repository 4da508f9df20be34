//! End-to-end tests of the `flow` binary: one integration test binary, one module per
//! area (ripgrep's layout), real files and real processes.

mod chaos;
mod crash;
mod daemon;
mod events;
mod flapping;
mod gateway;
mod retries;
mod runs;
mod secrets;
mod support;
mod validate;
