//! Sub-workflows in the console, in a real headless Chromium against a real `flow
//! serve`: a parent's run page lists its child runs as links, a child's links back to
//! its parent, the runs list filters by parent, and the In doubt worklist names the
//! parent that waits on a child's call.
//!
//! Screenshot: `$CARGO_TARGET_DIR/ui-screenshots/console-children.png`.

use std::time::Duration;

use fantoccini::Locator;
use flow_adapters::testkit::http::{Behavior, CountingServer};

use crate::api::{VIEWER, serve};
use crate::support::{Backend, TestDb, output, run_id, runtime, stderr};
use crate::ui::{browser, browser_missing, driver, sign_in, snap, wait_for};

const WAIT: Duration = Duration::from_secs(15);

#[test]
fn a_parent_links_its_children_and_a_child_its_parent() {
    if let Some(why) = browser_missing() {
        assert!(!flow_adapters::testkit::flags::ci(), "CI is set and {why}");
        eprintln!("skipped: {why}");
        return;
    }
    let rt = runtime();
    let down = rt.block_on(CountingServer::start()).expect("downstream");
    down.set("/provision/t2", Behavior::DropMidResponse);
    let db = TestDb::new(Backend::Sqlite);
    db.write(
        "child.yaml",
        &format!(
            r#"name: provision
inputs:
  tenant: {{ type: string, required: true }}
tools:
  post: {{ kind: http, method: POST, url: "{}/provision/${{{{ with.tenant }}}}", timeout: 5s }}
nodes:
  charge:
    tool: post
    with: {{ tenant: "${{{{ inputs.tenant }}}}" }}
"#,
            down.url()
        ),
    );
    let file = db.write(
        "parent.yaml",
        r#"name: tenants
nodes:
  provision:
    workflow: child.yaml
    for_each: { items: ["t1", "t2"], key: "${{ item }}" }
    with: { tenant: "${{ item }}" }
"#,
    );
    let out = output(db.flow().arg("run").arg(&file));
    assert_eq!(
        out.status.code(),
        Some(3),
        "t2's child is in doubt: {}",
        stderr(&out)
    );
    let run = run_id(&out);
    let server = serve(&db);
    let chrome = driver();
    rt.block_on(async {
        let c = browser(&chrome).await;
        sign_in(&c, &server, VIEWER).await;
        c.goto(&format!("{}/ui/runs/{run}", server.base))
            .await
            .expect("run page");
        let text = wait_for(&c, "#children", &format!("{run}.provision.t2"), WAIT).await;
        assert!(text.contains(&format!("{run}.provision.t1")), "{text}");
        assert!(text.contains("provision[t2]"), "each child's step: {text}");
        snap(&c, "console-children").await;
        // The child's page links back to its parent.
        c.find(Locator::LinkText(&format!("{run}.provision.t2")))
            .await
            .expect("child link")
            .click()
            .await
            .expect("open child");
        wait_for(&c, "#parent-run", &run, WAIT).await;
        // The worklist names the parent that waits.
        c.goto(&format!("{}/ui/in-doubt", server.base))
            .await
            .expect("in doubt");
        let row = wait_for(&c, "table", &format!("{run}.provision.t2"), WAIT).await;
        assert!(row.contains("child of"), "{row}");
        // The runs list filters by parent.
        c.goto(&format!("{}/ui/runs?parent={run}", server.base))
            .await
            .expect("runs of parent");
        let list = wait_for(&c, "table", &format!("{run}.provision.t1"), WAIT).await;
        assert!(
            !list.contains("tenants"),
            "only the children are listed: {list}"
        );
        let _ = c.close().await;
    });
}
