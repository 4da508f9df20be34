//! The HTTP adapter against the real counting server.

use std::time::Duration;

use flow_adapters::http::{Client, Spec};
use flow_adapters::testkit::http::{Behavior, CountingServer};
use flow_adapters::{Call, FailureKind, SideEffect, Tool};
use serde_json::{Value, json};

use crate::support::{TRANSIENT, assert_kind, err, ok};

async fn server() -> CountingServer {
    CountingServer::start()
        .await
        .unwrap_or_else(|e| panic!("starting the counting server: {e}"))
}

fn client() -> Client {
    Client::new().unwrap_or_else(|e| panic!("{e}"))
}

fn keyed(args: Value, key: &str) -> Call {
    Call::new(args, key, Duration::from_secs(10))
}

#[tokio::test]
async fn ok_json_and_idempotency_key_on_post() {
    let server = server().await;
    let tool = client().tool(Spec::new("POST", format!("{}/refunds", server.url())));
    let outcome = tool
        .call(keyed(json!({"order": "A-1"}), "run-1:refund:1"))
        .await;
    let output = ok(&outcome);
    assert_eq!(output["key"], json!("run-1:refund:1"));
    assert_eq!(output["body"], json!({"order": "A-1"}));
    assert_eq!(outcome.requests_sent, 1);
    assert_eq!(server.count("run-1:refund:1"), 1);
    let log = server.log();
    assert_eq!(log[0].header("content-type"), Some("application/json"));
    assert_eq!(tool.side_effect(), SideEffect::NotIdempotent);
}

#[tokio::test]
async fn get_sends_no_key_and_no_body_and_is_read_only() {
    let server = server().await;
    let mut spec = Spec::new("get", format!("{}/orders/7", server.url()));
    spec.query = vec![("expand".to_string(), "lines".to_string())];
    let tool = client().tool(spec);
    let outcome = tool.call(keyed(json!({"ignored": true}), "k")).await;
    assert_eq!(ok(&outcome)["method"], json!("GET"));
    let log = server.log();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].key, None, "no Idempotency-Key on GET");
    assert_eq!(log[0].body, Value::Null, "no body on GET");
    assert_eq!(log[0].query.as_deref(), Some("expand=lines"));
    assert_eq!(tool.side_effect(), SideEffect::ReadOnly);
}

#[tokio::test]
async fn custom_idempotency_header_name_and_declared_body() {
    let server = server().await;
    let mut spec = Spec::new("PUT", format!("{}/things/1", server.url()));
    spec.idempotency_header = Some("X-Request-Id".to_string());
    spec.headers = vec![("X-Tenant".to_string(), "acme".to_string())];
    spec.body = Some(json!({"declared": true}));
    spec.idempotent_header = true;
    let tool = client().tool(spec);
    let outcome = tool.call(keyed(json!({"from_with": true}), "key-7")).await;
    ok(&outcome);
    let log = server.log();
    assert_eq!(log[0].header("x-request-id"), Some("key-7"));
    assert_eq!(log[0].header("idempotency-key"), None);
    assert_eq!(log[0].header("x-tenant"), Some("acme"));
    assert_eq!(log[0].body, json!({"declared": true}));
    assert_eq!(tool.side_effect(), SideEffect::IdempotentHeader);
}

#[tokio::test]
async fn text_201_and_empty_bodies() {
    let server = server().await;
    server.set(
        "/text",
        Behavior::Text {
            status: 200,
            body: "plain words\n".to_string(),
        },
    );
    server.set(
        "/created",
        Behavior::Json {
            status: 201,
            body: json!({"id": "r-1"}),
        },
    );
    server.set(
        "/empty",
        Behavior::Text {
            status: 204,
            body: String::new(),
        },
    );
    let client = client();
    let text = client.tool(Spec::new("GET", format!("{}/text", server.url())));
    assert_eq!(
        ok(&text.call(keyed(Value::Null, "a")).await),
        &json!("plain words\n")
    );
    let created = client.tool(Spec::new("POST", format!("{}/created", server.url())));
    assert_eq!(
        ok(&created.call(keyed(json!({}), "b")).await),
        &json!({"id": "r-1"})
    );
    let empty = client.tool(Spec::new("DELETE", format!("{}/empty", server.url())));
    assert_eq!(ok(&empty.call(keyed(Value::Null, "c")).await), &Value::Null);
}

#[tokio::test]
async fn client_errors_are_permanent_with_status_and_body() {
    let server = server().await;
    server.set(
        "/bad",
        Behavior::Status {
            status: 400,
            retry_after: None,
            body: Some("amount must be positive".to_string()),
        },
    );
    let client = client();
    let outcome = client
        .tool(Spec::new("POST", format!("{}/bad", server.url())))
        .call(keyed(json!({"amount": -1}), "k"))
        .await;
    assert_kind(
        &outcome,
        FailureKind::Permanent,
        "HTTP 400 Bad Request: amount must be positive",
    );
    assert_eq!(outcome.requests_sent, 1);
    for status in [401, 403, 404, 409, 422] {
        server.set("/x", Behavior::status(status));
        let outcome = client
            .tool(Spec::new("POST", format!("{}/x", server.url())))
            .call(keyed(json!({}), "k"))
            .await;
        assert_kind(&outcome, FailureKind::Permanent, &format!("HTTP {status}"));
    }
}

#[tokio::test]
async fn retryable_statuses_are_transient_and_honour_retry_after() {
    let server = server().await;
    let client = client();
    let tool = client.tool(Spec::new("POST", format!("{}/x", server.url())));
    for status in [408, 425, 429, 500, 502, 503, 504] {
        server.set("/x", Behavior::status(status));
        let outcome = tool.call(keyed(json!({}), "k")).await;
        assert_eq!(
            err(&outcome).kind,
            FailureKind::Transient { retry_after: None },
            "status {status}"
        );
        assert_eq!(outcome.requests_sent, 1);
    }
    server.set("/x", Behavior::status_retry_after(429, "7"));
    let outcome = tool.call(keyed(json!({}), "k")).await;
    assert_eq!(
        err(&outcome).kind,
        FailureKind::Transient {
            retry_after: Some(Duration::from_secs(7))
        }
    );

    let date = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(120));
    server.set("/x", Behavior::status_retry_after(503, date));
    let outcome = tool.call(keyed(json!({}), "k")).await;
    match err(&outcome).kind {
        FailureKind::Transient {
            retry_after: Some(delay),
        } => {
            assert!(
                delay > Duration::from_secs(100) && delay <= Duration::from_secs(120),
                "{delay:?}"
            );
        }
        ref other => panic!("expected a transient error with a delay, got {other:?}"),
    }
}

#[tokio::test]
async fn fail_times_then_ok_counts_every_request() {
    let server = server().await;
    server.set(
        "/flaky",
        Behavior::FailTimes {
            times: 2,
            status: 503,
        },
    );
    let tool = client().tool(Spec::new("POST", format!("{}/flaky", server.url())));
    assert_kind(
        &tool.call(keyed(json!({}), "a:1")).await,
        TRANSIENT,
        "HTTP 503",
    );
    assert_kind(
        &tool.call(keyed(json!({}), "a:2")).await,
        TRANSIENT,
        "HTTP 503",
    );
    let outcome = tool.call(keyed(json!({}), "a:3")).await;
    assert_eq!(ok(&outcome)["key"], json!("a:3"));
    assert_eq!(server.total(), 3);
}

#[tokio::test]
async fn connect_refused_is_not_sent_with_nothing_counted() {
    // A port that was just free: nothing listens there.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let port = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("{e}"))
        .port();
    drop(listener);
    let tool = client().tool(Spec::new(
        "POST",
        format!("http://127.0.0.1:{port}/refunds?token=s3cret"),
    ));
    let outcome = tool.call(keyed(json!({}), "k")).await;
    assert_kind(&outcome, FailureKind::NotSent, "could not connect");
    assert_eq!(outcome.requests_sent, 0);
    assert!(
        !err(&outcome).message.contains("s3cret"),
        "the query is not quoted"
    );
}

#[tokio::test]
async fn dns_failure_is_not_sent() {
    // `.invalid` never resolves (RFC 6761); should a resolver hang instead, the 10 s
    // connect bound still classifies it as a connect failure within this timeout.
    let tool = client().tool(Spec::new("POST", "http://flow-test.invalid/refunds"));
    let outcome = tool
        .call(Call::new(json!({}), "k", Duration::from_secs(25)))
        .await;
    assert_kind(&outcome, FailureKind::NotSent, "could not connect");
    assert_eq!(outcome.requests_sent, 0);
}

#[tokio::test]
async fn timeout_while_held_is_unknown_and_was_counted() {
    let server = server().await;
    server.set("/slow", Behavior::HoldUntilReleased);
    let tool = client().tool(Spec::new("POST", format!("{}/slow", server.url())));
    let outcome = tool
        .call(Call::new(json!({}), "held:1", Duration::from_millis(1000)))
        .await;
    assert_kind(&outcome, FailureKind::Unknown, "timed out");
    assert_eq!(outcome.requests_sent, 1);
    assert_eq!(server.count("held:1"), 1, "the request arrived");
    assert_eq!(server.completed("held:1"), 0, "and was not answered");
    server.release();
}

#[tokio::test]
async fn slow_body_past_the_timeout_is_unknown() {
    let server = server().await;
    server.set(
        "/trickle",
        Behavior::Slow {
            chunks: 10,
            interval_ms: 100,
        },
    );
    let tool = client().tool(Spec::new("GET", format!("{}/trickle", server.url())));
    let outcome = tool
        .call(Call::new(Value::Null, "k", Duration::from_millis(350)))
        .await;
    assert_kind(&outcome, FailureKind::Unknown, "");
    assert_eq!(outcome.requests_sent, 1);
}

#[tokio::test]
async fn dropped_mid_response_is_unknown() {
    let server = server().await;
    server.set("/drop", Behavior::DropMidResponse);
    let tool = client().tool(Spec::new("POST", format!("{}/drop", server.url())));
    let outcome = tool.call(keyed(json!({}), "drop:1")).await;
    assert_kind(
        &outcome,
        FailureKind::Unknown,
        "while reading the HTTP 200 OK body",
    );
    assert_eq!(outcome.requests_sent, 1);
    assert_eq!(server.count("drop:1"), 1);
    assert_eq!(server.completed("drop:1"), 0);
}

#[tokio::test]
async fn redirects_are_refused_unless_asked_for() {
    let server = server().await;
    server.set(
        "/old",
        Behavior::Redirect {
            to: "/new".to_string(),
            status: 302,
        },
    );
    let client = client();
    let outcome = client
        .tool(Spec::new("GET", format!("{}/old", server.url())))
        .call(keyed(Value::Null, "k"))
        .await;
    assert_kind(&outcome, FailureKind::Permanent, "redirecting to /new");
    assert_eq!(server.total(), 1, "not followed");

    let mut spec = Spec::new("POST", format!("{}/old", server.url()));
    spec.follow_redirects = true;
    spec.headers = vec![(
        "Authorization".to_string(),
        "Bearer same-origin".to_string(),
    )];
    let outcome = client.tool(spec).call(keyed(json!({"a": 1}), "r:1")).await;
    let output = ok(&outcome);
    assert_eq!(output["path"], json!("/new"));
    assert_eq!(output["method"], json!("GET"), "302 turns POST into GET");
    assert_eq!(outcome.requests_sent, 2, "both hops are counted");
    let log = server.log();
    assert_eq!(log.len(), 3);
    assert_eq!(log[2].header("authorization"), Some("Bearer same-origin"));

    server.set(
        "/keep",
        Behavior::Redirect {
            to: "/new".to_string(),
            status: 307,
        },
    );
    let mut spec = Spec::new("POST", format!("{}/keep", server.url()));
    spec.follow_redirects = true;
    let outcome = client.tool(spec).call(keyed(json!({"a": 2}), "r:2")).await;
    assert_eq!(
        ok(&outcome)["method"],
        json!("POST"),
        "307 keeps the method"
    );
    assert_eq!(ok(&outcome)["body"], json!({"a": 2}));
    assert_eq!(
        ok(&outcome)["count"],
        json!(2),
        "the key went with both hops"
    );
}

#[tokio::test]
async fn cross_origin_redirect_drops_credentials() {
    let first = server().await;
    let second = server().await;
    first.set(
        "/go",
        Behavior::Redirect {
            to: format!("{}/landing", second.url()),
            status: 307,
        },
    );
    let mut spec = Spec::new("POST", format!("{}/go", first.url()));
    spec.follow_redirects = true;
    spec.headers = vec![(
        "Authorization".to_string(),
        "Bearer secret-token".to_string(),
    )];
    let outcome = client().tool(spec).call(keyed(json!({}), "x:1")).await;
    ok(&outcome);
    assert_eq!(second.log()[0].header("authorization"), None);
}

#[tokio::test]
async fn oversized_body_is_permanent_naming_the_cap() {
    let server = server().await;
    server.set("/big", Behavior::Big { bytes: 64 * 1024 });
    let mut spec = Spec::new("GET", format!("{}/big", server.url()));
    spec.max_response_bytes = 1024;
    let outcome = client().tool(spec).call(keyed(Value::Null, "k")).await;
    assert_kind(&outcome, FailureKind::Permanent, "1024-byte cap");
    assert_eq!(outcome.requests_sent, 1);
}

#[tokio::test]
async fn invalid_specs_are_permanent_and_never_sent() {
    let server = server().await;
    let client = client();
    let cases = [
        (Spec::new("GE T", server.url()), "invalid method"),
        (Spec::new("GET", "not a url"), "invalid url"),
        (
            Spec::new("GET", "ftp://127.0.0.1/x"),
            "unsupported url scheme",
        ),
    ];
    for (spec, text) in cases {
        let outcome = client.tool(spec).call(keyed(Value::Null, "k")).await;
        assert_kind(&outcome, FailureKind::Permanent, text);
        assert_eq!(outcome.requests_sent, 0);
    }
    let mut spec = Spec::new("GET", server.url());
    spec.headers = vec![("Authorization".to_string(), "Bearer bad\nvalue".to_string())];
    let outcome = client.tool(spec).call(keyed(Value::Null, "k")).await;
    assert_kind(
        &outcome,
        FailureKind::Permanent,
        "invalid value for header `Authorization`",
    );
    assert!(
        !err(&outcome).message.contains("bad"),
        "the value is not quoted"
    );
    assert_eq!(server.total(), 0);
}

#[tokio::test]
async fn read_only_override_wins() {
    let server = server().await;
    let mut spec = Spec::new("POST", format!("{}/search", server.url()));
    spec.read_only = Some(true);
    assert_eq!(client().tool(spec).side_effect(), SideEffect::ReadOnly);
    let mut spec = Spec::new("GET", format!("{}/tick", server.url()));
    spec.read_only = Some(false);
    assert_eq!(client().tool(spec).side_effect(), SideEffect::NotIdempotent);
}

#[tokio::test]
async fn the_pool_is_reused_across_calls() {
    let server = server().await;
    let client = client();
    for n in 0..5 {
        let tool = client.tool(Spec::new("POST", format!("{}/n", server.url())));
        ok(&tool.call(keyed(json!({"n": n}), &format!("p:{n}"))).await);
    }
    assert_eq!(server.total(), 5);
}
