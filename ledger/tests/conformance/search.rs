//! Finding runs (migration 0009, `ledger/src/search.rs`): by input value (strings and
//! numbers alike, several pairs ANDed), by id prefix (`%` and `_` are themselves), paged
//! by cursor while matching runs keep arriving, counted by status under the same filter,
//! and runs from before the migration backfilled by the rule new runs follow.

use std::time::Duration;

use flow_ledger::{
    ClaimRuns, Error, Ledger, MAX_INPUT_VALUE_LEN, NewRun, RunCursor, RunFilter, RunStatus,
    Timestamp, canonical_hash, workflow_hash,
};
use serde_json::{Value, json};
use sqlx::Connection;

use crate::common::{Backend, LEASE, T0, TestDb, empty_database, options, worker};

crate::conformance!(
    inputs_match_by_text_and_pairs_are_anded,
    paging_a_filtered_listing_holds_while_matching_runs_arrive,
    an_id_prefix_is_literal_text,
    counts_follow_the_filter_and_list_every_status,
    filters_no_run_can_match_are_refused,
    deleting_a_run_deletes_its_input_rows,
    a_batch_indexes_each_run_it_commits_and_a_failed_one_none,
);

fn run_with(id: &str, workflow: &str, inputs: Value) -> NewRun {
    NewRun {
        id: id.to_owned(),
        workflow_name: workflow.to_owned(),
        workflow_text: format!("name: {workflow}\nnodes: {{}}\n"),
        inputs,
        priority: 0,
        not_before: None,
        trace_parent: None,
    }
}

/// Enqueues one run 1 ms after the previous one, so the listing's order is the order
/// of these calls (newest last).
async fn add(db: &TestDb, id: &str, inputs: Value) {
    add_of(db, id, "wf", inputs).await;
}

async fn add_of(db: &TestDb, id: &str, workflow: &str, inputs: Value) {
    let at = db.advance(Duration::from_millis(1));
    let enq = db
        .ledger
        .enqueue(run_with(id, workflow, inputs), at)
        .await
        .expect("enqueue");
    assert!(enq.created, "{id}");
}

fn inputs(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn by_inputs(pairs: &[(&str, &str)]) -> RunFilter {
    RunFilter {
        inputs: inputs(pairs),
        ..Default::default()
    }
}

async fn ids(db: &TestDb, filter: RunFilter) -> Vec<String> {
    db.ledger
        .list_runs(filter)
        .await
        .expect("list")
        .into_iter()
        .map(|r| r.id)
        .collect()
}

async fn count(db: &TestDb, filter: &RunFilter, status: RunStatus) -> i64 {
    let counts = db.ledger.count_runs(filter).await.expect("count");
    counts
        .iter()
        .find(|(s, _)| *s == status)
        .map(|(_, n)| *n)
        .expect("every status is listed")
}

async fn inputs_match_by_text_and_pairs_are_anded(db: TestDb) {
    add(&db, "r1", json!({"order_id": 117, "region": "eu"})).await;
    add(&db, "r2", json!({"order_id": "117", "region": "us"})).await;
    add(&db, "r3", json!({"order_id": 118, "region": "eu"})).await;
    add(&db, "r4", json!({"order_id": "117 ", "region": "EU"})).await;
    add(
        &db,
        "r5",
        json!({"order_id": 1.5, "paid": true, "note": null}),
    )
    .await;
    add(
        &db,
        "r6",
        json!({"order_id": [117], "meta": {"order_id": 117}}),
    )
    .await;
    add(&db, "r7", json!({"paid": "true", "region": ""})).await;
    add_of(&db, "r8", "other", json!({"order_id": 117})).await;
    let find = |pairs: &'static [(&'static str, &'static str)]| ids(&db, by_inputs(pairs));
    // A number matches by its JSON text, so 117 and "117" are the same search; strings
    // match exactly (no trimming, no case folding); arrays and nested objects never.
    assert_eq!(find(&[("order_id", "117")]).await, ["r8", "r2", "r1"]);
    assert_eq!(find(&[("order_id", "1.5")]).await, ["r5"]);
    assert!(find(&[("order_id", "1.50")]).await.is_empty());
    assert!(find(&[("order_id", "[117]")]).await.is_empty());
    assert_eq!(find(&[("paid", "true")]).await, ["r7", "r5"]);
    assert!(
        find(&[("note", "null")]).await.is_empty(),
        "nulls get no row"
    );
    assert_eq!(find(&[("region", "")]).await, ["r7"]);
    assert_eq!(find(&[("region", "EU")]).await, ["r4"]);
    // Two pairs: both on the same run, in either order.
    assert_eq!(find(&[("order_id", "117"), ("region", "eu")]).await, ["r1"]);
    assert_eq!(find(&[("region", "eu"), ("order_id", "117")]).await, ["r1"]);
    assert!(
        find(&[("order_id", "117"), ("region", "asia")])
            .await
            .is_empty()
    );
    // No run has the value; no run has the key at all.
    assert!(find(&[("order_id", "119")]).await.is_empty());
    assert!(find(&[("customer", "117")]).await.is_empty());
    assert!(
        find(&[("region", "eu"), ("customer", "acme")])
            .await
            .is_empty()
    );
    // The other conditions still hold beside an input filter.
    let of_wf = RunFilter {
        workflow: Some("wf".into()),
        ..by_inputs(&[("order_id", "117")])
    };
    assert_eq!(ids(&db, of_wf).await, ["r2", "r1"]);
    let w = worker("1");
    db.ledger
        .claim_run("r2", &w, LEASE, db.now())
        .await
        .expect("claim");
    let queued = RunFilter {
        status: Some(RunStatus::Queued),
        ..by_inputs(&[("order_id", "117")])
    };
    assert_eq!(ids(&db, queued).await, ["r8", "r1"]);
    let r2 = db.ledger.get_run("r2").await.expect("r2");
    let since = RunFilter {
        since: Some(r2.created_at),
        ..by_inputs(&[("order_id", "117")])
    };
    assert_eq!(ids(&db, since).await, ["r8", "r2"]);
    let until = RunFilter {
        until: Some(r2.created_at),
        ..by_inputs(&[("order_id", "117")])
    };
    assert_eq!(ids(&db, until).await, ["r1"]);
    let one = RunFilter {
        limit: 1,
        ..by_inputs(&[("order_id", "117")])
    };
    assert_eq!(ids(&db, one).await, ["r8"]);
    // A re-submit of the same run writes no second set of rows.
    let again = db
        .ledger
        .enqueue(
            run_with("r1", "wf", json!({"order_id": 117, "region": "eu"})),
            db.now(),
        )
        .await
        .expect("re-submit");
    assert!(!again.created);
    assert_eq!(
        find(&[("order_id", "117")]).await,
        ["r8", "r2", "r1"],
        "still once each"
    );
}

/// 30 matching runs among as many others, read 7 at a time along the cursor while a
/// matching run arrives before every page: every page continues where the last ended,
/// so the walk sees each original run once, in order, and none of the newcomers (they
/// are newer than the first page). A new listing then starts with them.
async fn paging_a_filtered_listing_holds_while_matching_runs_arrive(db: TestDb) {
    let mut want = Vec::new();
    for i in 0..30 {
        let id = format!("m{i:02}");
        add(&db, &id, json!({"customer": "acme", "n": i})).await;
        add(
            &db,
            &format!("o{i:02}"),
            json!({"customer": "other", "n": i}),
        )
        .await;
        want.push(id);
    }
    want.reverse();
    let filter = |after: Option<RunCursor>| RunFilter {
        limit: 7,
        after,
        ..by_inputs(&[("customer", "acme")])
    };
    let (mut seen, mut after, mut pages) = (Vec::new(), None, 0);
    loop {
        add(&db, &format!("new{pages}"), json!({"customer": "acme"})).await;
        let page = db
            .ledger
            .list_runs(filter(after.clone()))
            .await
            .expect("page");
        pages += 1;
        let Some(last) = page.last() else { break };
        after = Some(RunCursor::after(last));
        seen.extend(page.iter().map(|r| r.id.clone()));
        assert!(page.len() <= 7);
    }
    // The first page was read after `new0` arrived, so it starts there.
    assert_eq!(seen.first().map(String::as_str), Some("new0"));
    assert_eq!(seen[1..], want[..], "each original run once, newest first");
    assert_eq!(
        pages, 6,
        "five pages of runs (31 of them), then an empty one"
    );
    // A fresh listing sees the newcomers first, newest first.
    let fresh = ids(&db, filter(None)).await;
    assert_eq!(fresh[..3], ["new5", "new4", "new3"]);
    // The same walk by the other pair of a two-pair filter gives the same runs.
    let both = RunFilter {
        limit: 100,
        ..by_inputs(&[("customer", "acme"), ("n", "3")])
    };
    assert_eq!(ids(&db, both).await, ["m03"]);
    let both = RunFilter {
        limit: 100,
        ..by_inputs(&[("n", "3"), ("customer", "acme")])
    };
    assert_eq!(ids(&db, both).await, ["m03"]);
}

/// The same on a database whose collation is linguistic (ICU `en-US`, where `run-1`
/// sorts between `run_` and `run_1` because punctuation is ignored at first): the
/// prefix is compared byte-wise whatever the database's collation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_id_prefix_is_literal_text_under_a_linguistic_collation() {
    // A server built without ICU cannot make such a database: say so and skip.
    let admin = crate::common::admin_url();
    let Ok(mut c) = sqlx::PgConnection::connect(&admin).await else {
        return; // unreachable: the other PostgreSQL tests say so loudly
    };
    let has_icu: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_collation WHERE collname = 'en-US-x-icu')",
    )
    .fetch_one(&mut c)
    .await
    .expect("pg_collation");
    if !has_icu {
        eprintln!("SKIPPING: this PostgreSQL has no ICU collations");
        return;
    }
    let icu = "TEMPLATE template0 ENCODING 'UTF8' LOCALE 'C' \
               LOCALE_PROVIDER icu ICU_LOCALE 'en-US'";
    if let Some(db) = crate::common::open_postgres_with(icu).await {
        an_id_prefix_is_literal_text(db).await;
    }
}

/// `%` and `_` are not wildcards, `-` is not ignored, case counts, and the prefix is
/// the whole start of the id, alone or beside an input filter and a cursor.
async fn an_id_prefix_is_literal_text(db: TestDb) {
    let all = [
        "run_1",
        "runX1",
        "run%1",
        "run%%",
        "ru",
        "run_",
        "RUN_1",
        "rux",
        "run\\1",
        "run_\u{e9}",
        "run-1",
    ];
    for (i, id) in all.iter().enumerate() {
        add(
            &db,
            id,
            json!({"k": if i % 2 == 0 { "even" } else { "odd" }}),
        )
        .await;
    }
    let prefixed = |p: &str| RunFilter {
        id_prefix: Some(p.to_owned()),
        ..Default::default()
    };
    assert_eq!(
        ids(&db, prefixed("run_")).await,
        ["run_\u{e9}", "run_", "run_1"]
    );
    assert_eq!(ids(&db, prefixed("run%")).await, ["run%%", "run%1"]);
    assert_eq!(ids(&db, prefixed("run%%")).await, ["run%%"]);
    assert_eq!(ids(&db, prefixed("run\\")).await, ["run\\1"]);
    assert_eq!(ids(&db, prefixed("RUN")).await, ["RUN_1"]);
    assert_eq!(ids(&db, prefixed("run_\u{e9}")).await, ["run_\u{e9}"]);
    assert!(ids(&db, prefixed("run_2")).await.is_empty());
    assert!(ids(&db, prefixed("zz")).await.is_empty());
    assert_eq!(ids(&db, prefixed("")).await.len(), all.len(), "empty: all");
    assert_eq!(ids(&db, prefixed("ru")).await.len(), 10, "all but RUN_1");
    // Beside an input filter: run_1 (0) and run_ (5) are "even" and "odd".
    let even = RunFilter {
        id_prefix: Some("run_".into()),
        ..by_inputs(&[("k", "even")])
    };
    assert_eq!(ids(&db, even).await, ["run_1"]);
    let odd = RunFilter {
        id_prefix: Some("run_".into()),
        ..by_inputs(&[("k", "odd")])
    };
    assert_eq!(ids(&db, odd).await, ["run_\u{e9}", "run_"]);
    // Along the cursor.
    let first = RunFilter {
        limit: 1,
        ..prefixed("run_")
    };
    let page = db.ledger.list_runs(first.clone()).await.expect("page");
    let next = RunFilter {
        after: page.last().map(RunCursor::after),
        ..first
    };
    assert_eq!(ids(&db, next).await, ["run_"]);
    assert_eq!(count(&db, &prefixed("run%"), RunStatus::Queued).await, 2);
}

async fn counts_follow_the_filter_and_list_every_status(db: TestDb) {
    for i in 0..6 {
        let workflow = if i < 4 { "billing" } else { "ship" };
        let region = if i % 2 == 0 { "eu" } else { "us" };
        let inputs = json!({"region": region, "batch": 7});
        add_of(&db, &format!("run_{i}"), workflow, inputs).await;
    }
    let w = worker("1");
    for id in ["run_0", "run_1", "run_4"] {
        db.ledger
            .claim_run(id, &w, LEASE, db.now())
            .await
            .expect("claim");
    }
    let all = db
        .ledger
        .count_runs(&RunFilter::default())
        .await
        .expect("count");
    assert_eq!(all.len(), RunStatus::ALL.len(), "every status, zeros too");
    assert!(
        RunStatus::ALL
            .iter()
            .all(|s| all.iter().any(|(k, _)| k == s))
    );
    assert_eq!(
        db.ledger.count_runs_by_status().await.expect("by status"),
        all
    );
    let eu = by_inputs(&[("region", "eu")]);
    assert_eq!(count(&db, &eu, RunStatus::Running).await, 2, "run_0, run_4");
    assert_eq!(count(&db, &eu, RunStatus::Queued).await, 1, "run_2");
    assert_eq!(count(&db, &eu, RunStatus::Failed).await, 0);
    // Status, cursor and limit are ignored: the counts are of the whole match.
    let paged = RunFilter {
        status: Some(RunStatus::Queued),
        limit: 1,
        after: Some(RunCursor {
            created_at: T0,
            id: String::new(),
        }),
        ..eu.clone()
    };
    assert_eq!(
        db.ledger.count_runs(&paged).await.expect("count"),
        db.ledger.count_runs(&eu).await.expect("count")
    );
    let billing_eu = RunFilter {
        workflow: Some("billing".into()),
        ..by_inputs(&[("region", "eu"), ("batch", "7")])
    };
    assert_eq!(count(&db, &billing_eu, RunStatus::Running).await, 1);
    assert_eq!(count(&db, &billing_eu, RunStatus::Queued).await, 1);
    let ship = RunFilter {
        workflow: Some("ship".into()),
        ..Default::default()
    };
    assert_eq!(count(&db, &ship, RunStatus::Queued).await, 1);
    assert_eq!(count(&db, &ship, RunStatus::Running).await, 1);
    let run_3 = db.ledger.get_run("run_3").await.expect("run_3");
    let since = RunFilter {
        since: Some(run_3.created_at),
        ..eu.clone()
    };
    assert_eq!(count(&db, &since, RunStatus::Running).await, 1, "run_4");
    assert_eq!(count(&db, &since, RunStatus::Queued).await, 0);
    let prefix = RunFilter {
        id_prefix: Some("run_4".into()),
        ..eu
    };
    assert_eq!(count(&db, &prefix, RunStatus::Running).await, 1);
    let none = by_inputs(&[("region", "asia")]);
    let counts = db.ledger.count_runs(&none).await.expect("count");
    assert!(counts.iter().all(|(_, n)| *n == 0), "{counts:?}");
    assert_eq!(counts.len(), RunStatus::ALL.len());
}

async fn filters_no_run_can_match_are_refused(db: TestDb) {
    add(&db, "r1", json!({"k": "v"})).await;
    let long_key = "k".repeat(129);
    let long_value = "v".repeat(MAX_INPUT_VALUE_LEN + 1);
    let cases = [
        by_inputs(&[("k", "v"), (long_key.as_str(), "v")]),
        by_inputs(&[("bad key", "v")]),
        by_inputs(&[("", "v")]),
        by_inputs(&[("k", long_value.as_str())]),
        by_inputs(&[("k", "a\0b")]),
        RunFilter {
            id_prefix: Some("r".repeat(129)),
            ..Default::default()
        },
        RunFilter {
            id_prefix: Some("r\0".into()),
            ..Default::default()
        },
    ];
    for filter in cases {
        let listed = db.ledger.list_runs(filter.clone()).await;
        assert!(
            matches!(listed, Err(Error::InvalidFilter { .. })),
            "{filter:?}: {listed:?}"
        );
        let counted = db.ledger.count_runs(&filter).await;
        assert!(
            matches!(counted, Err(Error::InvalidFilter { .. })),
            "{filter:?}"
        );
    }
    let msg = db
        .ledger
        .list_runs(by_inputs(&[(long_key.as_str(), "v")]))
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        msg.contains("input name") && msg.contains("129 bytes long, over 128"),
        "{msg}"
    );
    // The longest value that is indexed is found.
    let edge = "v".repeat(MAX_INPUT_VALUE_LEN);
    add(&db, "r2", json!({ "k": edge })).await;
    assert_eq!(ids(&db, by_inputs(&[("k", edge.as_str())])).await, ["r2"]);
}

/// `enqueue_batch` writes its runs' rows together before it commits: every run of a
/// batch is found (also when the rows outgrow one write, 1 MiB, and go out early), a
/// re-submitted run adds none, and a batch that fails leaves none behind.
async fn a_batch_indexes_each_run_it_commits_and_a_failed_one_none(db: TestDb) {
    // 3 runs of 400 inputs of 1,000 bytes: 1.2 MB of rows, past the early write.
    let wide = |tag: &str| -> Value {
        let mut m = serde_json::Map::new();
        for k in 0..400 {
            m.insert(
                format!("k{k:03}"),
                json!(format!("{tag}{}", "x".repeat(999))),
            );
        }
        m.insert("batch".into(), json!(1));
        Value::Object(m)
    };
    let runs = ["a", "b", "c"].map(|t| run_with(&format!("wide_{t}"), "wf", wide(t)));
    let now = db.advance(Duration::from_millis(1));
    let got = db
        .ledger
        .enqueue_batch(runs.to_vec(), None, now)
        .await
        .expect("batch");
    assert!(got.iter().all(|e| e.created));
    assert_eq!(input_row_count(&db.url).await, 3 * 401);
    let found = ids(&db, by_inputs(&[("batch", "1")])).await;
    assert_eq!(found, ["wide_c", "wide_b", "wide_a"]);
    let value = format!("b{}", "x".repeat(999));
    let one = by_inputs(&[("k399", value.as_str()), ("batch", "1")]);
    assert_eq!(ids(&db, one).await, ["wide_b"]);
    // A re-submit of the batch plus one new run: only the new run adds rows.
    let mut again = runs.to_vec();
    again.push(run_with("small", "wf", json!({"batch": 2})));
    db.ledger
        .enqueue_batch(again, None, now)
        .await
        .expect("re-submit");
    assert_eq!(input_row_count(&db.url).await, 3 * 401 + 1);
    // A batch whose last run conflicts rolls back, the rows of its first run included.
    let failed = vec![
        run_with("lost", "wf", json!({"batch": 3})),
        run_with("small", "wf", json!({"batch": 4})),
    ];
    let err = db.ledger.enqueue_batch(failed, None, now).await;
    assert!(matches!(err, Err(Error::Conflict { .. })), "{err:?}");
    assert!(ids(&db, by_inputs(&[("batch", "3")])).await.is_empty());
    assert_eq!(input_row_count(&db.url).await, 3 * 401 + 1);
}

async fn deleting_a_run_deletes_its_input_rows(db: TestDb) {
    add(&db, "gone", json!({"k": "v", "n": 1})).await;
    add(&db, "kept", json!({"k": "v"})).await;
    assert_eq!(input_row_count(&db.url).await, 3);
    // No ledger operation deletes runs; whatever does (an operator's SQL, a retention
    // job) takes the run's rows with it (ON DELETE CASCADE).
    execute(&db.url, "DELETE FROM runs WHERE id = 'gone'").await;
    assert_eq!(input_row_count(&db.url).await, 1);
    assert_eq!(ids(&db, by_inputs(&[("k", "v")])).await, ["kept"]);
}

async fn execute(url: &str, sql: &str) {
    let sql = sqlx::AssertSqlSafe(sql.to_owned());
    if url.starts_with("sqlite:") {
        let mut c = sqlx::SqliteConnection::connect(url).await.expect("connect");
        sqlx::raw_sql(sql).execute(&mut c).await.expect("execute");
    } else {
        let mut c = sqlx::PgConnection::connect(url).await.expect("connect");
        sqlx::raw_sql(sql).execute(&mut c).await.expect("execute");
    }
}

async fn input_row_count(url: &str) -> usize {
    input_rows(url, None).await.len()
}

/// `(run_id, key, value)` of every `run_inputs` row (of one run), in order.
async fn input_rows(url: &str, run: Option<&str>) -> Vec<(String, String, String)> {
    let sql = "SELECT run_id, key, value FROM run_inputs
               WHERE $1 IS NULL OR run_id = $1 ORDER BY run_id, key";
    if url.starts_with("sqlite:") {
        let mut c = sqlx::SqliteConnection::connect(url).await.expect("connect");
        sqlx::query_as(sql)
            .bind(run)
            .fetch_all(&mut c)
            .await
            .expect("rows")
    } else {
        let mut c = sqlx::PgConnection::connect(url).await.expect("connect");
        sqlx::query_as(sql)
            .bind(run)
            .fetch_all(&mut c)
            .await
            .expect("rows")
    }
}

// ---------------------------------------------------------------------------------------
// Runs from before migration 0009: backfilled by the rule new runs follow.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_runs_from_before_migration_0009_are_found_by_input() {
    runs_from_before_the_migration_are_backfilled(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_runs_from_before_migration_0009_are_found_by_input() {
    runs_from_before_the_migration_are_backfilled(Backend::Postgres).await;
}

/// Inputs that exercise every branch of the rule: each kind of scalar, numbers in the
/// forms serde_json writes, keys the grammar takes and refuses, the length bound, and
/// strings that need JSON escapes.
fn tricky_inputs() -> Value {
    json!({
        "order_id": 117, "sku": "117", "price": 1.5, "big": 1e20, "tiny": 1e-7,
        "huge": u64::MAX, "neg": -3, "paid": true, "off": false, "note": null,
        "items": [1], "meta": {"a": 1}, "a.b": 7, "x-y": "z", "9": "nine", "_": "under",
        "bad key": "x", "long": "x".repeat(MAX_INPUT_VALUE_LEN + 1),
        "edge": "y".repeat(MAX_INPUT_VALUE_LEN), "uni": "ключ ✓ \u{1F600}",
        "esc": "quote\" back\\slash\ttab\n", "empty": "",
    })
}

/// Old runs as flow 0008 wrote them (no `run_inputs` rows), on a database migrated to
/// 0008 only. `inputs` is the JSON text serde_json writes, as the ledger stores it.
fn old_runs_sql(runs: &[(&str, Value)]) -> String {
    let text = "name: wf\nnodes: {}\n";
    let mut sql = String::new();
    for (i, (id, inputs)) in runs.iter().enumerate() {
        sql.push_str(&format!(
            "INSERT INTO runs (tenant, workspace, id, workflow_name, workflow_text,
                workflow_hash, inputs, inputs_hash, status, priority, not_before,
                created_at, updated_at)
             VALUES ('default', 'default', '{id}', 'wf', '{text}', '{}', '{}', '{}',
                'queued', 0, {t}, {t}, {t});\n",
            workflow_hash(text),
            inputs.to_string().replace('\'', "''"),
            canonical_hash(inputs),
            t = T0.0 + i as i64,
        ));
    }
    sql
}

async fn runs_from_before_the_migration_are_backfilled(backend: Backend) {
    let Some(empty) = empty_database(backend).await else {
        return;
    };
    let nul = json!({"k": "v", "nul": "a\u{0}b"});
    let old = [
        ("old_tricky", tricky_inputs()),
        ("old_plain", json!({"order_id": "117", "region": "eu"})),
        ("old_nul", nul.clone()),
        ("old_array", json!([117, "117"])),
        ("old_scalar", json!("117")),
        ("old_empty", json!({})),
    ];
    let sql = sqlx::AssertSqlSafe(old_runs_sql(&old));
    if backend == Backend::Sqlite {
        let url = format!("{}?mode=rwc", empty.url);
        let mut c = sqlx::SqliteConnection::connect(&url)
            .await
            .expect("connect");
        let m = sqlx::migrate!("../migrations/sqlite");
        m.run_to(8, &mut c).await.expect("migrate to 0008");
        sqlx::raw_sql(sql).execute(&mut c).await.expect("old rows");
        c.close().await.expect("close");
    } else {
        let mut c = sqlx::PgConnection::connect(&empty.url)
            .await
            .expect("connect");
        let m = sqlx::migrate!("../migrations/postgres");
        m.run_to(8, &mut c).await.expect("migrate to 0008");
        sqlx::raw_sql(sql).execute(&mut c).await.expect("old rows");
        c.close().await.expect("close");
    }
    // Opening migrates to 0009, which backfills.
    let ledger = Ledger::open(&empty.url, options()).await.expect("open");
    let now = Timestamp(T0.0 + 1_000);
    for (id, inputs) in [("new_tricky", tricky_inputs()), ("new_nul", nul)] {
        ledger
            .enqueue(run_with(id, "wf", inputs), now)
            .await
            .expect("new run");
    }
    // The backfill wrote exactly the rows a new run with the same inputs gets.
    let rows = |run| input_rows(&empty.url, Some(run));
    let strip = |rows: Vec<(String, String, String)>| -> Vec<(String, String)> {
        rows.into_iter().map(|(_, k, v)| (k, v)).collect()
    };
    let old_rows = strip(rows("old_tricky").await);
    assert_eq!(old_rows, strip(rows("new_tricky").await));
    let keys: Vec<&str> = old_rows.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "9", "_", "a.b", "big", "edge", "empty", "esc", "huge", "neg", "off", "order_id",
            "paid", "price", "sku", "tiny", "uni", "x-y"
        ]
    );
    let value = |k: &str| {
        old_rows
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(value("big").as_deref(), Some("1e+20"));
    assert_eq!(value("tiny").as_deref(), Some("1e-7"));
    assert_eq!(value("huge"), Some(u64::MAX.to_string()));
    assert_eq!(value("esc").as_deref(), Some("quote\" back\\slash\ttab\n"));
    // Not an object: no rows. A NUL anywhere in an old run's inputs: no rows (a new run
    // leaves out only the value that holds it).
    for id in ["old_array", "old_scalar", "old_empty", "old_nul"] {
        assert!(rows(id).await.is_empty(), "{id}");
    }
    assert_eq!(strip(rows("new_nul").await), [("k".into(), "v".into())]);
    // Found through the ledger, old and new alike.
    let found = |pairs: &[(&str, &str)]| {
        let filter = by_inputs(pairs);
        let ledger = ledger.clone();
        async move {
            let runs = ledger.list_runs(filter).await.expect("list");
            runs.into_iter().map(|r| r.id).collect::<Vec<_>>()
        }
    };
    assert_eq!(
        found(&[("order_id", "117")]).await,
        ["new_tricky", "old_plain", "old_tricky"]
    );
    assert_eq!(
        found(&[("order_id", "117"), ("region", "eu")]).await,
        ["old_plain"]
    );
    assert_eq!(
        found(&[("uni", "ключ ✓ \u{1F600}"), ("off", "false")]).await,
        ["new_tricky", "old_tricky"]
    );
    // Old runs keep working otherwise: claimable, counted.
    let w = worker("1");
    let claimed = ledger
        .claim_next_runs(
            ClaimRuns {
                worker: &w,
                lease: LEASE,
                limit: 1,
            },
            now,
        )
        .await
        .expect("claim");
    assert_eq!(claimed[0].run.id, "old_tricky");
    ledger.close().await;
}
