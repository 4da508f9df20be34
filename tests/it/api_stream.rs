//! The event feed as Server-Sent Events, through a real server on both backends: events
//! arrive live with `id` = seq, `Last-Event-ID` resumes after a seq, a viewer may follow,
//! no token is a 401.

use std::time::{Duration, Instant};

use reqwest::StatusCode;

use crate::api::{HELLO, VIEWER, serve};
use crate::support::{Backend, TestDb, backends, output, run_id, runtime, stderr};

/// Reads the stream until `until` appears in it (or 15 s pass); the text read.
async fn read_until(resp: &mut reqwest::Response, until: &str) -> String {
    let mut text = String::new();
    let deadline = Instant::now() + Duration::from_secs(15);
    while !text.contains(until) {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "`{until}` never came; the stream said:\n{text}"
        );
        match tokio::time::timeout(left, resp.chunk()).await {
            Ok(Ok(Some(bytes))) => text.push_str(&String::from_utf8_lossy(&bytes)),
            Ok(Ok(None)) => panic!("the stream ended; it said:\n{text}"),
            Ok(Err(e)) => panic!("the stream failed: {e}"),
            Err(_) => {}
        }
    }
    text
}

fn ids(text: &str) -> Vec<i64> {
    text.lines()
        .filter_map(|l| l.strip_prefix("id: ").or_else(|| l.strip_prefix("id:")))
        .filter_map(|v| v.trim().parse().ok())
        .collect()
}

fn stream_feed(backend: Backend) {
    let ctx = format!("{backend:?}");
    let db = TestDb::new(backend);
    let hello = db.write("hello.yaml", HELLO);
    let server = serve(&db);
    let rt = runtime();
    rt.block_on(async {
        let http = reqwest::Client::new();
        let url = format!("{}/api/v1/events:stream", server.base);
        let anonymous = http.get(&url).send().await.expect("get");
        assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED, "{ctx}");

        // From now on: a run made after the stream opened shows up live.
        let mut live = http
            .get(&url)
            .bearer_auth(VIEWER)
            .send()
            .await
            .expect("get");
        assert_eq!(live.status(), StatusCode::OK, "{ctx}");
        assert!(
            live.headers().get("content-type").is_some_and(|v| v
                .to_str()
                .unwrap_or_default()
                .starts_with("text/event-stream")),
            "{ctx}"
        );
        let out = output(db.flow().arg("run").arg(&hello));
        assert_eq!(out.status.code(), Some(0), "{ctx}: {}", stderr(&out));
        let run = run_id(&out);
        let text = read_until(&mut live, "event: run.succeeded").await;
        assert!(text.contains(&run), "{ctx}: {text}");
        let seen = ids(&text);
        assert!(
            seen.windows(2).all(|w| w[0] < w[1]),
            "{ctx}: ids ascend: {seen:?}"
        );
        assert!(text.contains("event: run.started"), "{ctx}: {text}");

        // Resuming after the first event sends the rest, not the first again.
        let first = seen[0];
        let mut resumed = http
            .get(&url)
            .bearer_auth(VIEWER)
            .header("Last-Event-ID", first.to_string())
            .send()
            .await
            .expect("get");
        let again = read_until(&mut resumed, "event: run.succeeded").await;
        let again_ids = ids(&again);
        assert!(
            !again_ids.contains(&first) && again_ids.iter().all(|i| *i > first),
            "{ctx}: {again_ids:?}"
        );
        let bad = http
            .get(&url)
            .bearer_auth(VIEWER)
            .header("Last-Event-ID", "x")
            .send()
            .await
            .expect("get");
        assert_eq!(bad.status(), StatusCode::BAD_REQUEST, "{ctx}");
    });
}

#[test]
fn the_event_stream_is_live_resumable_and_authenticated() {
    for b in backends() {
        stream_feed(b);
    }
}
