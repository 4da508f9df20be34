//! The trace context the ledger keeps for OpenTelemetry (migration 0019). A call's is
//! written by its outbound mark (`outbound.rs`, from [`crate::CallLease::trace_parent`]),
//! kept across claims of the same key and forgotten with the key on a new attempt; a
//! run's `trace_segment` holds its submitter's `traceparent` until its first claim
//! (written by the enqueue), then its latest execution segment's (written here).

use crate::conn::args;
use crate::error::Error;
use crate::fence::{Fence, run_fence};
use crate::ledger::Ledger;
use crate::model::RunLease;

impl Ledger {
    /// Records the span context (`traceparent` text) of the execution segment `lease`
    /// holds, so the run's next segment — a resume or a takeover — links to it. Fenced
    /// by the run lease; a lease lost meanwhile writes nothing, and is no error here (the
    /// next write of the run says so).
    pub async fn set_trace_segment(&self, lease: &RunLease, context: &str) -> Result<(), Error> {
        let ledger = self.clone();
        let lease = lease.clone();
        let context = context.to_owned();
        self.write_statement(move |c| {
            Box::pin(async move {
                let mut a = Fence::run(ledger.scope(), &lease);
                a.extend(args![context.as_str()]);
                c.execute(
                    concat!("UPDATE runs SET trace_segment = $6 WHERE", run_fence!()),
                    a,
                )
                .await?;
                Ok(())
            })
        })
        .await
    }
}
