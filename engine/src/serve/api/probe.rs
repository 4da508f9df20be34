//! `POST /api/v1/runs/{id}/reconcile`: "probe now" — ask the downstream about every
//! in-doubt call of a paused or finished run whose tool declares `reconcile:` (as `flow
//! reconcile --run`); a paused run whose last doubt a probe settles is re-queued by the
//! ledger's resolution. The probes are recorded
//! like any other (`by`: the token's name), so the run's probe history shows who asked.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use flow_ledger::RunStatus;
use schemars::JsonSchema;
use serde::Serialize;

use super::steer::Why;
use crate::reconcile::{ProbeCall, reconcile_call};
use crate::serve::App;
use crate::serve::auth::{Authed, Caller, Operator};
use crate::serve::problem::{OptionalJson, Problem};
use crate::view::RunView;

/// `POST /api/v1/runs/{id}/reconcile`: 200 `{ "probes": [{node, key, outcome}], "run": … }`;
/// 404 unknown run; 409 when the run is not paused (its holder probes its own calls).
pub async fn reconcile(
    Authed(caller, _): Authed<Operator>,
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    OptionalJson(why): OptionalJson<Why>,
) -> Result<Response, Problem> {
    let probes = probe_run(&app, &caller, &id, why.reason).await?;
    let run = RunView::load(&app.ledger, &id)
        .await
        .map_err(|e| Problem::ledger(&e))?;
    Ok(Json(ProbeAnswer { probes, run }).into_response())
}

/// What "probe now" did, and the run after.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ProbeAnswer {
    /// One per call in doubt whose node the workflow names.
    pub probes: Vec<ProbeOutcome>,
    /// The run after the probes.
    pub run: RunView,
}

/// What became of one call in doubt.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ProbeOutcome {
    /// The node.
    pub node: String,
    /// The key asked about.
    pub key: String,
    /// What the probe found and did.
    pub outcome: crate::reconcile::Reconciled,
}

/// Probes the in-doubt calls of paused run `id` now, as `caller`; what each came to.
/// The one way the API and the console probe.
pub(crate) async fn probe_run(
    app: &App,
    caller: &Caller,
    id: &str,
    reason: Option<String>,
) -> Result<Vec<ProbeOutcome>, Problem> {
    let run = app.ledger.get_run(id).await.map_err(|e| match e {
        flow_ledger::Error::NotFound { .. } => Problem::not_found(format!("no run `{id}`")),
        e => Problem::ledger(&e),
    })?;
    // A finished run's calls in doubt are probed too: their outcome is still to be
    // recorded (found → succeeded), though nothing is re-sent for them.
    if !(run.status == RunStatus::Paused || run.status.is_terminal()) {
        return Err(Problem::conflict(format!(
            "run `{id}` is {}: only a paused or finished run's calls are probed on request (a running run's holder probes its own)",
            run.status
        )));
    }
    let wf = crate::snapshot::snapshot(&run)
        .map_err(|e| Problem::ledger(&flow_ledger::Error::Corrupt { what: e }))?;
    let filter = flow_ledger::InDoubtFilter {
        run_id: Some(id.to_string()),
        ..Default::default()
    };
    let calls = app
        .ledger
        .list_in_doubt(filter)
        .await
        .map_err(|e| Problem::ledger(&e))?;
    // Who asked (and why) is the probes' `by`: the run's probe history shows it.
    let by = match reason {
        Some(why) => format!("{} (probe now: {why})", caller.name),
        None => format!("{} (probe now)", caller.name),
    };
    let mut out = Vec::with_capacity(calls.len());
    for c in &calls {
        let Some(node) = wf.node(crate::item_id::node_of(&c.tool_call_id)) else {
            continue;
        };
        let call = ProbeCall {
            wf: &wf,
            node,
            call_id: &c.tool_call_id,
            run_id: id,
            inputs: &run.inputs,
            by: &by,
            now_regardless: true,
            dry_run: false,
            run_live: !run.status.is_terminal(),
        };
        let outcome = reconcile_call(&app.gateway, call)
            .await
            .map_err(|crate::reconcile::Error::Ledger(e)| Problem::ledger(&e))?;
        out.push(ProbeOutcome {
            node: c.tool_call_id.clone(),
            key: c.current_key.clone(),
            outcome,
        });
    }
    // A settled last doubt re-queued the run in the ledger's resolution.
    Ok(out)
}
