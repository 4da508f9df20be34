//! A `wait:` node's step, run by the executor (it calls no tool, so it never crosses
//! the gateway): its wait is begun (or found) in the ledger, then the events published
//! under its name are read page by page from where the last look stopped; the first its
//! `match` accepts completes it. Otherwise the step waits, and a publish puts the run
//! back on the queue (`flow_ledger` `waits/`).

use flow_ledger::{BeginWait, StepStatus, WaitKind, WaitStatus};
use serde_json::Value as Json;

use crate::duration_text::whole_millis;
use crate::gateway::{self, Awaited, Gateway, NodeStep, StepResult};
use crate::workflow::expr;
use crate::workflow::model::WaitDecl;

/// Runs a `wait:` node's step: `Waiting` until an accepted event is found or its
/// timeout passes (then its `on_timeout`).
pub(super) async fn run_wait(
    gw: &Gateway,
    c: NodeStep<'_>,
    w: &WaitDecl,
) -> Result<StepResult, gateway::Error> {
    look(gw, &c, w)
        .await
        .map_err(|e| gateway::Error::from_ledger(e, &c.run().run_id))
}

async fn look(
    gw: &Gateway,
    c: &NodeStep<'_>,
    w: &WaitDecl,
) -> Result<StepResult, flow_ledger::Error> {
    let node_id = c.node.id.as_str();
    let step = gw.new_step(c, StepStatus::Running);
    c.writer.open_step(c.origin, step, gw.now()).await?;
    let begin = BeginWait {
        node_id: node_id.to_owned(),
        step_id: c.step_id.clone(),
        kind: WaitKind::Event,
        event_name: Some(w.event.clone()),
        matcher: w
            .matcher
            .as_ref()
            .and_then(|t| t.whole_expr())
            .map(str::to_owned),
        lookback_ms: whole_millis(w.lookback),
        timeout_ms: whole_millis(w.timeout),
        heartbeat_ms: None,
        token_hash: None,
    };
    let wait = gw.ledger().begin_wait(c.run(), begin, gw.now()).await?;
    if wait.status != WaitStatus::Pending {
        return gw.wait_result(c, wait, w.on_timeout).await;
    }
    let run_id = c.run().run_id.as_str();
    let Some((wait, mut events)) = gw.ledger().wait_candidates(run_id, node_id, None).await? else {
        return Err(flow_ledger::Error::LeaseLost);
    };
    // Page by page from where the last look stopped; the signal read first counts
    // every event a page misses.
    let mut cursor = wait.seen_seq;
    loop {
        if let Some(event) = events.iter().find(|e| accepts(c, w, e)) {
            let now = gw.now();
            let done = gw
                .ledger()
                .complete_event_wait(c.run(), node_id, event, now)
                .await?;
            return gw.wait_result(c, done, w.on_timeout).await;
        }
        cursor = events.last().map_or(cursor, |e| e.seq);
        if events.len() < flow_ledger::MAX_WAIT_CANDIDATES {
            break;
        }
        events = match gw
            .ledger()
            .wait_candidates(run_id, node_id, Some(cursor))
            .await?
        {
            Some((_, page)) => page,
            None => return Err(flow_ledger::Error::LeaseLost),
        };
    }
    gw.ledger()
        .saw_signal(c.run(), node_id, wait.signal, cursor)
        .await?;
    Ok(StepResult::Waiting {
        deadline: wait.deadline,
        on: Awaited::Event(w.event.clone()),
    })
}

/// Whether `w`'s `match` accepts `event` (no `match`: any event of the name). An
/// expression that cannot be evaluated on this event does not accept it.
fn accepts(c: &NodeStep<'_>, w: &WaitDecl, event: &flow_ledger::PublishedEvent) -> bool {
    let Some(m) = &w.matcher else {
        return true;
    };
    let mut ctx = c.ctx.clone();
    if let Json::Object(map) = &mut ctx {
        map.insert("event".into(), event.data.clone());
    }
    match expr::eval_condition(m, &ctx) {
        Ok(b) => b,
        Err(e) => {
            tracing::debug!(node = %c.node.id, event = %event.event_id, error = %e, "event does not match (its `match` could not be evaluated)");
            false
        }
    }
}
