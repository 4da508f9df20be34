//! A `for_each` node in the console, in a real headless Chromium against a real
//! `flow serve`: the run page shows the node as one row with a progress bar and its
//! counts, the items that did not simply succeed behind one click (in doubt first), and
//! an *All items* page that pages every item by key; the API pages the same.
//!
//! Screenshot: `$CARGO_TARGET_DIR/ui-screenshots/console-for-each.png`.

use std::time::Duration;

use fantoccini::{Client, Locator};
use flow_adapters::testkit::http::{Behavior, CountingServer};
use serde_json::Value;

use crate::api::{Server, VIEWER, call, serve};
use crate::support::{Backend, TestDb, output, run_id, runtime, stderr};
use crate::ui::{browser, browser_missing, driver, sign_in, snap, wait_for};

const WAIT: Duration = Duration::from_secs(15);

fn workflow(url: &str) -> String {
    format!(
        r#"name: mail
inputs:
  customers: {{ type: array, required: true }}
tools:
  post: {{ kind: http, method: POST, url: "{url}/mail/${{{{ with.id }}}}", timeout: 5s }}
nodes:
  notify:
    for_each:
      items: "${{{{ inputs.customers }}}}"
      key: "${{{{ item.id }}}}"
      concurrency: 4
      tolerate: {{ failed: 5 }}
    tool: post
    with: {{ id: "${{{{ item.id }}}}" }}
"#
    )
}

#[test]
fn a_fan_out_is_one_row_with_its_progress_and_a_paged_item_table() {
    if let Some(why) = browser_missing() {
        assert!(!flow_adapters::testkit::flags::ci(), "CI is set and {why}");
        eprintln!("skipped: {why}");
        return;
    }
    let rt = runtime();
    let down = rt.block_on(CountingServer::start()).expect("downstream");
    down.set("/mail/c03", Behavior::DropMidResponse);
    down.set("/mail/c07", Behavior::status(400));
    let db = TestDb::new(Backend::Sqlite);
    let file = db.write("mail.yaml", &workflow(&down.url()));
    let ids: Vec<Value> = (1..=12)
        .map(|i| serde_json::json!({ "id": format!("c{i:02}") }))
        .collect();
    let inputs = db.write(
        "in.json",
        &serde_json::json!({ "customers": ids }).to_string(),
    );
    let out = output(
        db.flow()
            .arg("run")
            .arg(&file)
            .arg("--inputs-file")
            .arg(&inputs),
    );
    assert_eq!(
        out.status.code(),
        Some(3),
        "c03 is in doubt: {}",
        stderr(&out)
    );
    let run = run_id(&out);
    let server = serve(&db);

    // The API pages every item by key.
    let page: Value = rt.block_on(async {
        let (status, body) = call(
            &server,
            "GET",
            &format!("/api/v1/runs/{run}/items?node=notify&limit=5"),
            Some(VIEWER),
            None,
        )
        .await;
        assert_eq!(status, reqwest::StatusCode::OK, "{body}");
        body
    });
    let keys: Vec<&str> = page["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["key"].as_str())
        .collect();
    assert_eq!(keys, ["c01", "c02", "c03", "c04", "c05"], "{page}");
    assert_eq!(page["next"], "c05");

    let chrome = driver();
    rt.block_on(async {
        let c = browser(&chrome).await;
        sign_in(&c, &server, VIEWER).await;
        run_page(&c, &server, &run).await;
        item_pages(&c, &server, &run).await;
        let _ = c.close().await;
    });
}

async fn js(c: &Client, script: &str) -> Value {
    c.execute(script, Vec::new())
        .await
        .unwrap_or_else(|e| panic!("{script}: {e}"))
}

/// One row for the node: the bar at 11 of 12 done, the counts, and behind one click the
/// item in doubt before the failed one.
async fn run_page(c: &Client, server: &Server, run: &str) {
    c.goto(&format!("{}/ui/runs/{run}", server.base))
        .await
        .expect("run page");
    wait_for(c, "#node-notify .fan small", "11 of 12 items done", WAIT).await;
    let text = wait_for(c, "#node-notify .fan small", "1 in doubt", WAIT).await;
    assert!(text.contains("10 succeeded, 1 failed"), "{text}");
    let bar = js(
        c,
        "const p = document.querySelector('#node-notify progress'); return [p.value, p.max];",
    )
    .await;
    assert_eq!(bar, serde_json::json!([11, 12]));
    let open = js(c, "return document.querySelector('#items-notify').open;").await;
    assert_eq!(open, false, "the items are folded away until asked for");
    c.find(Locator::Css("#items-notify summary"))
        .await
        .expect("summary")
        .click()
        .await
        .expect("open");
    let listed = js(
        c,
        "return [...document.querySelectorAll('#items-notify tbody tr td:first-child')].map(t => t.textContent);",
    )
    .await;
    assert_eq!(listed, serde_json::json!(["c03", "c07"]), "in doubt first");
    snap(c, "console-for-each").await;
}

/// *All items*, five at a time, filtered by state.
async fn item_pages(c: &Client, server: &Server, run: &str) {
    c.goto(&format!(
        "{}/ui/runs/{run}/items?node=notify&limit=5",
        server.base
    ))
    .await
    .expect("items page");
    wait_for(c, "h1", "Items of", WAIT).await;
    let keys = |c: &Client| {
        let c = c.clone();
        async move {
            js(
                &c,
                "return [...document.querySelectorAll('#items tbody tr td:first-child')].map(t => t.textContent);",
            )
            .await
        }
    };
    assert_eq!(
        keys(c).await,
        serde_json::json!(["c01", "c02", "c03", "c04", "c05"])
    );
    c.find(Locator::Css("a[rel=next]"))
        .await
        .expect("next")
        .click()
        .await
        .expect("click next");
    wait_for(c, "#items tbody tr td", "c06", WAIT).await;
    assert_eq!(
        keys(c).await,
        serde_json::json!(["c06", "c07", "c08", "c09", "c10"])
    );
    // The form's "any" sends an empty state: no filter, not an error.
    c.goto(&format!(
        "{}/ui/runs/{run}/items?node=notify&status=&limit=5",
        server.base
    ))
    .await
    .expect("any state");
    wait_for(c, "#items tbody tr td", "c01", WAIT).await;
    c.goto(&format!(
        "{}/ui/runs/{run}/items?node=notify&status=failed",
        server.base
    ))
    .await
    .expect("failed items");
    let text = wait_for(c, "#items tbody", "c07", WAIT).await;
    assert!(text.contains("HTTP 400"), "the error is shown");
    assert_eq!(keys(c).await, serde_json::json!(["c07"]));
}
