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
