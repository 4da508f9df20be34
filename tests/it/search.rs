//! Runs found by their input values, their id's start and their status, on both
//! backends and through every face: `flow runs --input`, `GET /api/v1/runs?input.…`
//! (with counts by status) and the console's runs list.

use reqwest::StatusCode;
use serde_json::Value;

use crate::api::{VIEWER, call, serve};
use crate::support::{Backend, TestDb, backends, output, runtime, stderr, stdout};
use crate::ui::http_session;

const ORDER: &str = "name: order\ninputs:\n  order_id: { type: integer, required: true }\n  region: { type: string, default: eu }\ntools:\n  echo: { kind: function, function: core.echo }\nnodes:\n  look: { tool: echo, with: { id: \"${{ inputs.order_id }}\" } }\n";

#[test]
fn runs_are_found_by_input_prefix_and_status_on_both_backends() {
    for backend in backends() {
        search(backend);
    }
}

fn search(backend: Backend) {
    let ctx = format!("{backend:?}");
    let db = TestDb::new(backend);
    let file = db.write("order.yaml", ORDER);
    for (id, order, region) in [
        ("ord-117-a", 117, "eu"),
        ("ord-117-b", 117, "us"),
        ("ord-118", 118, "eu"),
        ("other-1", 1, "eu"),
    ] {
        let out = output(db.flow().arg("submit").arg(&file).args([
            "--run-id",
            id,
            "--input",
            &format!("order_id={order}"),
            "--input",
            &format!("region={region}"),
        ]));
        assert_eq!(out.status.code(), Some(0), "{ctx}: {}", stderr(&out));
    }
    let ids = |args: &[&str]| -> Vec<String> {
        let out = output(db.flow().args(["runs", "--json"]).args(args));
        assert_eq!(out.status.code(), Some(0), "{ctx}: {}", stderr(&out));
        let list: Value = serde_json::from_str(&stdout(&out)).expect("JSON");
        let mut ids: Vec<String> = list
            .as_array()
            .map(|l| {
                l.iter()
                    .filter_map(|r| r["id"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        ids.sort();
        ids
    };
    assert_eq!(
        ids(&["--input", "order_id=117"]),
        ["ord-117-a", "ord-117-b"],
        "{ctx}"
    );
    assert_eq!(
        ids(&["--input", "order_id=117", "--input", "region=us"]),
        ["ord-117-b"],
        "{ctx}"
    );
    assert!(ids(&["--input", "order_id=119"]).is_empty(), "{ctx}");
    assert_eq!(ids(&["--prefix", "ord-11"]).len(), 3, "{ctx}");
    let bad = output(db.flow().args(["runs", "--input", "=1"]));
    assert_eq!(bad.status.code(), Some(2), "{ctx}: {}", stderr(&bad));

    let server = serve(&db);
    let rt = runtime();
    rt.block_on(async {
        let (s, page) = call(
            &server,
            "GET",
            "/api/v1/runs?input.order_id=117&counts=true",
            Some(VIEWER),
            None,
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{ctx}: {page}");
        assert_eq!(
            page["runs"].as_array().map(Vec::len),
            Some(2),
            "{ctx}: {page}"
        );
        let queued = page["counts"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["status"] == "queued"))
            .map(|c| c["count"].clone());
        assert_eq!(queued, Some(serde_json::json!(2)), "{ctx}: {page}");
        let (s, page) = call(
            &server,
            "GET",
            "/api/v1/runs?prefix=other",
            Some(VIEWER),
            None,
        )
        .await;
        assert_eq!(
            (s, page["runs"][0]["id"].clone()),
            (StatusCode::OK, serde_json::json!("other-1")),
            "{ctx}"
        );
        assert_eq!(page["counts"], Value::Null, "{ctx}: counts only when asked");
        for bad in [
            "/api/v1/runs?input.=1",
            "/api/v1/runs?input.a%00b=1",
            "/api/v1/runs?nope=1",
        ] {
            let (s, p) = call(&server, "GET", bad, Some(VIEWER), None).await;
            assert_eq!(s, StatusCode::BAD_REQUEST, "{ctx}: {bad}: {p}");
        }

        let (http, cookie, _) = http_session(&server, VIEWER).await;
        let html = http
            .get(format!("{}/ui/runs?input=order_id%3D117", server.base))
            .header("cookie", &cookie)
            .send()
            .await
            .expect("page")
            .text()
            .await
            .expect("html");
        assert!(
            html.contains("ord-117-a") && html.contains("ord-117-b"),
            "{ctx}: {html}"
        );
        assert!(
            !html.contains("ord-118") && !html.contains("other-1"),
            "{ctx}: only the matches"
        );
        assert!(
            html.contains(r#"id="count-queued">2<"#),
            "{ctx}: the counts follow the filter"
        );
        assert!(html.contains(r#"id="count-all">2<"#), "{ctx}");
    });
}
