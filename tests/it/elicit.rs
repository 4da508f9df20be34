//! MCP elicitation through the real binary: each tool's `elicitation:` policy answers
//! the testkit server's `elicitation/create`, over stdio and streamable HTTP, on both
//! backends.

use flow_adapters::testkit::mcp::HttpServer;

use crate::support::{TestDb, backends, call, output, run_id, runtime, show, stderr, stdout};

fn workflow(bin: &str, url: &str) -> String {
    format!(
        r#"name: mcp-elicit
tools:
  declines:
    kind: mcp
    server: {{ command: ["{bin}", "mcp-stdio"] }}
    tool: elicit
  defaults:
    kind: mcp
    server: {{ command: ["{bin}", "mcp-stdio"] }}
    tool: elicit
    elicitation: accept_defaults
  given:
    kind: mcp
    server: {{ url: "{url}" }}
    tool: elicit
    elicitation: {{ accept: {{ name: bob, age: 7 }} }}
  misfit:
    kind: mcp
    server: {{ url: "{url}" }}
    tool: elicit
    elicitation: {{ accept: {{ name: 3 }} }}
nodes:
  a: {{ tool: declines }}
  b: {{ tool: defaults }}
  c: {{ tool: given }}
  d: {{ tool: misfit }}
"#
    )
}

#[test]
fn each_policy_answers_the_server_over_stdio_and_http() {
    let rt = runtime();
    let server = rt.block_on(HttpServer::start(None)).expect("mcp server");
    let bin = flow_adapters::testkit::bin_path();
    for backend in backends() {
        let db = TestDb::new(backend);
        let file = db.write(
            "w.yaml",
            &workflow(&bin.display().to_string(), &server.url()),
        );
        let out = output(
            db.flow()
                .arg("run")
                .arg(&file)
                .env("RUST_LOG", "warn,flow_adapters::mcp=info"),
        );
        assert_eq!(out.status.code(), Some(0), "{backend:?}: {}", stderr(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("output JSON");
        assert_eq!(
            v["a"],
            serde_json::json!({"action": "decline", "content": null}),
            "{}",
            stdout(&out)
        );
        assert_eq!(
            v["b"],
            serde_json::json!({"action": "accept", "content": {"name": "ada"}})
        );
        assert_eq!(
            v["c"],
            serde_json::json!({"action": "accept", "content": {"name": "bob", "age": 7}})
        );
        assert_eq!(v["d"]["action"], "decline");
        // Each question and decision is logged, with field names and never the values.
        let log = stderr(&out);
        assert!(log.contains("flow testkit asks"), "{log}");
        assert!(
            log.contains("elicitation accepted with fields [age, name]"),
            "{log}"
        );
        assert!(
            log.contains("elicitation declined: the policy is decline"),
            "{log}"
        );
        assert!(!log.contains("bob"), "a value was logged: {log}");
        let s = show(&db, &run_id(&out));
        assert_eq!(call(&s, "c")["status"], "succeeded", "{s:#}");
    }
}

/// Each elicitation is recorded on the call that was asked (over stdio, the session's
/// one call in flight; over HTTP, the call whose response stream carried it): the
/// question, the answer and the policy that decided, with a secret the answer carries
/// scrubbed — in `flow show` and in everything stored.
#[test]
fn each_answer_is_recorded_on_its_call_with_secrets_scrubbed() {
    let rt = runtime();
    let server = rt.block_on(HttpServer::start(None)).expect("mcp server");
    let bin = flow_adapters::testkit::bin_path();
    let secret = "tok-s3cret-9f2";
    for backend in backends() {
        let db = TestDb::new(backend);
        let file = db.write(
            "w.yaml",
            &format!(
                r#"name: mcp-elicit-recorded
tools:
  declines:
    kind: mcp
    server: {{ command: ["{bin}", "mcp-stdio"] }}
    tool: elicit
  defaults:
    kind: mcp
    server: {{ url: "{url}" }}
    tool: elicit
    elicitation: accept_defaults
nodes:
  asked:
    tool: declines
  token:
    tool: defaults
    with:
      schema:
        type: object
        properties:
          token: {{ type: string, default: "${{{{ secrets.API_TOKEN }}}}" }}
        required: [token]
"#,
                bin = bin.display(),
                url = server.url()
            ),
        );
        let out = output(
            db.flow()
                .arg("run")
                .arg(&file)
                .env("FLOW_SECRET_API_TOKEN", secret),
        );
        assert_eq!(out.status.code(), Some(0), "{backend:?}: {}", stderr(&out));
        let run = run_id(&out);
        let s = show(&db, &run);
        let asked = &call(&s, "asked")["elicitations"];
        assert_eq!(asked.as_array().map(Vec::len), Some(1), "{s:#}");
        assert_eq!(asked[0]["message"], "flow testkit asks");
        assert_eq!(asked[0]["action"], "decline");
        assert_eq!(asked[0]["decided_by"], "policy decline");
        assert!(
            asked[0]["requested"]["properties"]["name"].is_object(),
            "{s:#}"
        );
        let token = &call(&s, "token")["elicitations"];
        assert_eq!(token.as_array().map(Vec::len), Some(1), "{s:#}");
        assert_eq!(token[0]["action"], "accept");
        assert_eq!(token[0]["decided_by"], "policy accept_defaults");
        assert_eq!(
            token[0]["content"]["token"], r#"{"$secret":"API_TOKEN"}"#,
            "{s:#}"
        );
        let shown = stdout(&output(db.flow().args(["show", &run, "--json"])));
        assert!(!shown.contains(secret), "a secret was stored: {shown}");
    }
}
