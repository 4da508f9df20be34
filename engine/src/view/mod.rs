//! The typed views of runs: what `flow show --json`, every API response and the
//! console's pages serialize, and what the OpenAPI document describes.
//!
//! One struct per thing a reader sees — [`RunView`] (a run with its nodes, steps,
//! calls, probes and audit trail), [`RunSummary`] (a run in a listing), [`CallView`]
//! (a tool call, also an inbox row), [`ProbeView`], [`AuditEntry`] — so a field has
//! one name wherever it appears. They sit below both `cli` and `serve` (neither
//! imports the other) and are built from the ledger's rows here and nowhere else.
//!
//! The schema derive is `schemars`: it reads the serde attributes the views already
//! carry (renames, flattening), emits JSON Schema 2020-12, which OpenAPI 3.1 uses as
//! is, and is already in the build through `rmcp`. `serve::openapi` puts these
//! schemas under `components.schemas`.
//!
//! Fields renamed when the views were unified keep their old name too, for one release
//! ([`call::CallAliases`], the `step_id`/`node_id` of [`StepView`], the `tool_call_id`
//! of [`ProbeView`]): marked `deprecated` in the schema, removed in the next release.

pub mod approval;
pub mod call;
pub mod event;
pub mod inbox;
pub mod items;
pub mod run;
pub mod time;
pub mod wait;

pub use approval::ApprovalView;
pub use call::{AuditEntry, CallView, ErrorView, ProbeView, ResolutionView};
pub use event::EventView;
pub use inbox::{InboxRow, ProbeVerdict};
pub use items::{ItemView, ItemsView};
pub use run::{ChildrenView, NodeView, ParentView, RunInfo, RunSummary, RunView, StepView};
pub use time::parse_time;
pub use wait::WaitView;
