//! Live pages without losing work: `GET /ui/events`, the outbox as Server-Sent Events
//! for a signed-in browser, and `GET /ui/assets/live.js`, the console's one script,
//! which listens to it and, on an event that concerns the page, fetches the page again
//! and swaps in only its live regions (`data-live="…"`), keeping any region the user is
//! working in (see the script's header for the rule).
//!
//! The API has the same feed (`/api/v1/events:stream`), but it needs a bearer token and
//! a browser has only the session cookie, so the console serves its own, behind the
//! [`Signed`] extractor. Each event carries only what the script needs to decide
//! (`seq`, `type`, `run`, `node`): the page it re-fetches shows the rest under the same
//! session. Like the API's, the stream polls the ledger (every 500 ms while nothing is
//! new), resumes after `Last-Event-ID`, and is a live view, not a delivery.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event as Sse, KeepAlive};
use axum::response::{IntoResponse, Response};
use flow_ledger::{Event, EventFilter, Ledger};
use futures::stream::{self, Stream};
use serde::Deserialize;
use serde_json::json;

use super::session::Signed;
use super::{Page, Ui};

/// How long the stream waits before asking the ledger again when nothing was new.
const POLL: Duration = Duration::from_millis(500);

/// Events read per poll.
const BATCH: u32 = 100;

/// `GET /ui/assets/live.js`.
pub async fn script() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=300"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        include_str!("assets/live.js"),
    )
}

/// The query of `GET /ui/events`.
#[derive(Debug, Default, Deserialize)]
pub struct LiveQuery {
    /// Only events of this run (a run page).
    run: Option<String>,
    /// Only events after this `seq`: the last one when the page was rendered, so
    /// nothing between the render and the connection is missed (`Last-Event-ID` wins).
    after: Option<i64>,
    /// Only events whose type starts with one of these (comma-separated; empty: all):
    /// the inbox needs a handful of types, not every step of a thousand runs.
    types: Option<String>,
}

/// `GET /ui/events?run=&after=&types=`: the outbox as SSE for this session (any role
/// may follow: a viewer sees the same pages).
pub async fn events(
    _: Signed,
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    q: Result<Query<LiveQuery>, QueryRejection>,
) -> Result<Response, Page> {
    let Query(q) = q.map_err(|e| Page::error(StatusCode::BAD_REQUEST, e.body_text()))?;
    let resumed = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<i64>().ok());
    let after = match resumed.or(q.after) {
        Some(seq) => Some(seq),
        None => last_seq(&ui.app.ledger).await?,
    };
    let run = q.run.filter(|r| !r.is_empty());
    let types = Types::parse(q.types.as_deref().unwrap_or_default());
    Ok(
        axum::response::Sse::new(follow(ui.app.ledger.clone(), after, run, types))
            .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
            .into_response(),
    )
}

/// The outbox's last `seq` (what a page rendered now has seen).
pub(super) async fn last_seq(ledger: &Ledger) -> Result<Option<i64>, Page> {
    ledger
        .last_event_seq()
        .await
        .map_err(|e| Page::from(crate::serve::problem::Problem::ledger(&e)))
}

/// The type prefixes a stream sends (none: every event).
#[derive(Debug, Clone, Default)]
struct Types(Vec<String>);

impl Types {
    fn parse(text: &str) -> Types {
        Types(
            text.split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(str::to_string)
                .collect(),
        )
    }

    fn wants(&self, e: &Event) -> bool {
        self.0.is_empty()
            || self
                .0
                .iter()
                .any(|p| e.event_type.as_str().starts_with(p.as_str()))
    }
}

/// What the script reads of an event.
fn message(e: &Event) -> Sse {
    let data = json!({
        "seq": e.seq,
        "type": e.event_type.as_str(),
        "run": e.run_id,
        "node": e.tool_call_id,
    });
    Sse::default().id(e.seq.to_string()).data(data.to_string())
}

/// The events after `after` (of `run`, of `types`), as they are written.
fn follow(
    ledger: Ledger,
    after: Option<i64>,
    run: Option<String>,
    types: Types,
) -> impl Stream<Item = Result<Sse, Infallible>> {
    let state = (ledger, after, (run, types), VecDeque::<Event>::new());
    stream::unfold(
        state,
        |(ledger, mut after, which, mut buffered)| async move {
            loop {
                if let Some(e) = buffered.pop_front() {
                    return Some((Ok(message(&e)), (ledger, after, which, buffered)));
                }
                let (run, types) = &which;
                let filter = EventFilter {
                    run_id: run.clone(),
                    after_seq: after,
                    limit: BATCH,
                };
                match ledger.list_events(filter).await {
                    Ok(events) if !events.is_empty() => {
                        after = events.last().map(|e| e.seq);
                        buffered.extend(events.into_iter().filter(|e| types.wants(e)));
                    }
                    Ok(_) => tokio::time::sleep(POLL).await,
                    Err(e) => {
                        tracing::warn!(error = %e, "the console's event stream cannot read the ledger; retrying");
                        tokio::time::sleep(POLL * 4).await;
                    }
                }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_message_names_only_what_the_script_decides_on() {
        let e = Event {
            seq: 42,
            id: "evt_1".into(),
            event_type: flow_ledger::EventType::ToolCallResolved,
            time: flow_ledger::Timestamp(0),
            run_id: Some("r1".into()),
            step_id: Some("charge".into()),
            tool_call_id: Some("charge".into()),
            payload: json!({"by": "otto", "note": "secret-ish words"}),
        };
        let text = format!("{:?}", message(&e));
        assert!(
            text.contains("42") && text.contains("tool_call.resolved"),
            "{text}"
        );
        assert!(
            !text.contains("secret-ish"),
            "the payload stays on the server: {text}"
        );
    }

    #[test]
    fn a_stream_sends_only_the_types_asked_for() {
        let e = |t: flow_ledger::EventType| Event {
            seq: 1,
            id: "evt_1".into(),
            event_type: t,
            time: flow_ledger::Timestamp(0),
            run_id: None,
            step_id: None,
            tool_call_id: None,
            payload: json!({}),
        };
        let some = Types::parse(" tool_call.in_doubt, tool_call.resolved ,");
        assert!(some.wants(&e(flow_ledger::EventType::ToolCallResolved)));
        assert!(!some.wants(&e(flow_ledger::EventType::StepStarted)));
        let prefix = Types::parse("run.");
        assert!(prefix.wants(&e(flow_ledger::EventType::RunFailed)));
        assert!(!prefix.wants(&e(flow_ledger::EventType::ToolCallProbed)));
        assert!(Types::parse("").wants(&e(flow_ledger::EventType::StepStarted)));
    }

    #[test]
    fn the_script_keeps_to_the_csp() {
        let js = include_str!("assets/live.js");
        for banned in [
            "eval(",
            "new Function",
            "innerHTML =",
            "document.write",
            "setTimeout(\"",
        ] {
            assert!(!js.contains(banned), "live.js uses {banned}");
        }
    }
}
