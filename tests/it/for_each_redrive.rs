//! A failed fan-out redriven (issue 54's incident: one bad item of 300, the rest never
//! sent): the failed and never-sent items go out once, under the keys they always had,
//! and the items that succeeded are not sent again — counted per key at the downstream,
//! on both backends, with the redriven execution SIGKILLed while items are in flight.

use std::collections::{HashMap, HashSet};
use std::process::Stdio;
use std::time::{Duration, Instant};

use flow_adapters::testkit::http::{Behavior, CountingServer};
use serde_json::{Value, json};

use crate::support::{TestDb, backends, output, run_id, runtime, stderr};

const ITEMS: usize = 300;
/// The item whose mail service refuses it (a 400: failed, not in doubt).
const BAD: &str = "c150";

fn workflow(url: &str) -> String {
    format!(
        r#"name: fanout
inputs:
  customers: {{ type: array, required: true }}
tools:
  post: {{ kind: http, method: POST, url: "{url}/mail/${{{{ with.id }}}}", timeout: 10s, idempotency: header }}
nodes:
  notify:
    for_each:
      items: "${{{{ inputs.customers }}}}"
      key: "${{{{ item.id }}}}"
      concurrency: 4
    tool: post
    with: {{ id: "${{{{ item.id }}}}" }}
    retry_policy: {{ max_retries: 3 }}
"#
    )
}

#[test]
fn a_failed_fan_out_redriven_sends_the_failed_and_never_sent_items_once() {
    let rt = runtime();
    for backend in backends() {
        let server = rt.block_on(CountingServer::start()).expect("server");
        server.set(&format!("/mail/{BAD}"), Behavior::status(400));
        let db = TestDb::new(backend);
        let ids: Vec<String> = (0..ITEMS).map(|i| format!("c{i:03}")).collect();
        let file = db.write("w.yaml", &workflow(&server.url()));
        let list: Vec<Value> = ids.iter().map(|id| json!({ "id": id })).collect();
        let inputs = db.write("in.json", &json!({ "customers": list }).to_string());
        let failed = output(
            db.flow()
                .arg("run")
                .arg(&file)
                .arg("--inputs-file")
                .arg(&inputs),
        );
        assert_eq!(
            failed.status.code(),
            Some(1),
            "{backend:?}: {}",
            stderr(&failed)
        );
        let run = run_id(&failed);
        let key = |id: &str, attempt: u32| format!("{run}:notify[{id}]:{attempt}");
        // What went out before the failure: the items in list order up to the bad
        // one and those in flight beside it; the rest never left.
        let sent: Vec<&String> = ids
            .iter()
            .filter(|id| server.count(&key(id, 1)) == 1)
            .collect();
        let never: Vec<&String> = ids
            .iter()
            .filter(|id| server.count(&key(id, 1)) == 0)
            .collect();
        assert!(
            sent.len() > 100 && !never.is_empty(),
            "{backend:?}: {} sent",
            sent.len()
        );
        assert_eq!(
            sent.len() + never.len(),
            ITEMS,
            "{backend:?}: no key sent twice"
        );

        server.set(&format!("/mail/{BAD}"), Behavior::status(200));
        let before = server.total();
        let redrive = output(db.flow().args(["redrive", &run]));
        assert_eq!(
            redrive.status.code(),
            Some(0),
            "{backend:?}: {}",
            stderr(&redrive)
        );
        // The redriven execution is killed with its requests held at the downstream
        // (certainly sent), then resumed: the held ones are sent again under the same
        // key (the tool declares the downstream dedupes on it; the re-send spends the
        // retry budget), nothing else twice.
        let held_keys = kill_while_held(&db, &server, &run, before);
        server.set("*", Behavior::status(200));
        server.release();
        let resumed = output(db.flow().args(["resume", &run]));
        assert_eq!(
            resumed.status.code(),
            Some(0),
            "{backend:?}: {}",
            stderr(&resumed)
        );

        let expected: HashSet<String> = never
            .iter()
            .map(|id| key(id, 1))
            .chain([key(BAD, 2)])
            .collect();
        let mut per_key: HashMap<String, u32> = HashMap::new();
        for r in server
            .log()
            .into_iter()
            .filter(|r| r.seq > u64::from(before))
        {
            *per_key.entry(r.key.unwrap_or_default()).or_default() += 1;
        }
        for (k, n) in &per_key {
            assert!(expected.contains(k), "{backend:?}: {k} sent by the redrive");
            let most = if held_keys.contains(k) { 2 } else { 1 };
            assert!(*n <= most, "{backend:?}: {k} sent {n} times");
        }
        assert_eq!(per_key.len(), expected.len(), "{backend:?}: every one sent");
        for id in sent.iter().filter(|id| id.as_str() != BAD) {
            assert_eq!(server.count(&key(id, 1)), 1, "{backend:?}: {id} replayed");
        }
        assert_eq!(server.count(&key(BAD, 1)), 1, "{backend:?}");
    }
}

/// Starts `flow resume RUN` with every request held at the downstream, SIGKILLs it once
/// four have arrived (certainly sent: the downstream has them), and returns the keys
/// that arrived after `before`.
fn kill_while_held(
    db: &TestDb,
    server: &CountingServer,
    run: &str,
    before: u32,
) -> HashSet<String> {
    server.set("*", Behavior::HoldUntilReleased);
    let mut victim = db
        .flow()
        .args(["resume", run])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn flow resume");
    let held = || server.total() - before;
    let start = Instant::now();
    while held() < 4 && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = victim.kill();
    let _ = victim.wait();
    assert!(held() >= 4, "only {} requests before the kill", held());
    server
        .log()
        .into_iter()
        .filter(|r| r.seq > u64::from(before))
        .filter_map(|r| r.key)
        .collect()
}
