//! `GET /api/v1/events:stream?after=&run=`: the event feed as Server-Sent Events, for a
//! page or a script that follows run changes live. Each outbox event is one SSE event:
//! `id` its `seq` (a reconnecting client sends it back as `Last-Event-ID` and the stream
//! goes on after it), `event` its type, `data` the same JSON object `GET /api/v1/events`
//! lists. The stream polls the ledger (every 500 ms while there is nothing new) and sends
//! a comment every 15 s so proxies keep the connection open.
//!
//! A live view, not a delivery: on PostgreSQL an event whose transaction commits after a
//! later-numbered one may be passed over; consumers that must see every event use
//! `[[consumers]]` (README: Events), which waits for such transactions.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event as Sse, KeepAlive};
use axum::response::{IntoResponse, Response};
use flow_ledger::{Event, EventFilter};
use futures::stream::{self, Stream};
use serde::Deserialize;

use crate::serve::App;
use crate::serve::auth::{Authed, Viewer};
use crate::serve::problem::{ApiQuery, Problem};
use crate::view::EventView;

/// How long the stream waits before asking the ledger again when nothing was new.
const POLL: Duration = Duration::from_millis(500);

/// The query of `GET /api/v1/events:stream`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StreamQuery {
    /// Only events after this `seq` (default: from now on; `Last-Event-ID` wins).
    after: Option<i64>,
    /// Only events of this run.
    run: Option<String>,
}

/// `GET /api/v1/events:stream`.
pub async fn stream(
    _: Authed<Viewer>,
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    ApiQuery(q): ApiQuery<StreamQuery>,
) -> Result<Response, Problem> {
    let resumed = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.trim().parse::<i64>().map_err(|_| {
                Problem::bad_request(format!("Last-Event-ID: not an event seq: `{v}`"))
            })
        })
        .transpose()?;
    let after = match resumed.or(q.after) {
        Some(seq) => Some(seq),
        None => app
            .ledger
            .last_event_seq()
            .await
            .map_err(|e| Problem::ledger(&e))?,
    };
    let events = follow(app, after, q.run);
    Ok(axum::response::Sse::new(events)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}

/// The events after `after` (of `run`), as they are written.
fn follow(
    app: Arc<App>,
    after: Option<i64>,
    run: Option<String>,
) -> impl Stream<Item = Result<Sse, Infallible>> {
    let state = (app, after, run, Vec::<Event>::new());
    stream::unfold(state, |(app, mut after, run, mut buffered)| async move {
        loop {
            if !buffered.is_empty() {
                let e = buffered.remove(0); // at most 100 buffered: cheap
                let sse = Sse::default()
                    .id(e.seq.to_string())
                    .event(e.event_type.as_str())
                    .data(serde_json::to_string(&EventView::of(&e)).unwrap_or_default());
                return Some((Ok(sse), (app, after, run, buffered)));
            }
            let filter = EventFilter {
                run_id: run.clone(),
                after_seq: after,
                limit: 100,
            };
            match app.ledger.list_events(filter).await {
                Ok(events) if !events.is_empty() => {
                    after = events.last().map(|e| e.seq);
                    buffered = events;
                }
                Ok(_) => tokio::time::sleep(POLL).await,
                Err(e) => {
                    tracing::warn!(error = %e, "the event stream cannot read the ledger; retrying");
                    tokio::time::sleep(POLL * 4).await;
                }
            }
        }
    })
}
