//! Workflow texts stored once per hash (migration 0007): a batch writes each distinct
//! text once, every read of a run gets its full text back, re-submits still compare the
//! hash, and runs written before the migration keep reading their inline text.

use flow_ledger::events::{EventFilter, EventType};
use flow_ledger::{
    ClaimRuns, Error, Ledger, NewRun, OpenOptions, RunFilter, RunFinish, RunStatus, Scope,
    Timestamp, canonical_hash, workflow_hash,
};
use serde_json::json;
use sqlx::Connection;

use crate::common::{Backend, LEASE, T0, TestDb, empty_database, options, scalar, worker};

crate::conformance!(
    a_batch_of_one_text_stores_it_once_and_every_run_reads_it_back,
    two_texts_in_one_batch_are_two_rows,
    a_resubmit_still_compares_the_hash,
    each_scope_stores_its_own_copy,
    a_batch_answers_in_order_and_queues_each_new_run_once,
);

/// About 5 KB of workflow: what a real multi-node file weighs.
fn big_text(name: &str) -> String {
    let mut text = format!("name: {name}\nnodes:\n");
    let mut i = 0;
    while text.len() < 5_000 {
        text.push_str(&format!(
            "  n{i}: {{ tool: t, with: {{ order: \"${{{{ inputs.order }}}}\", i: {i} }} }}\n"
        ));
        i += 1;
    }
    text
}

fn run_of(id: &str, text: &str) -> NewRun {
    NewRun {
        id: id.to_owned(),
        workflow_name: "wf".into(),
        workflow_text: text.to_owned(),
        inputs: json!({"order": id}),
        priority: 0,
        not_before: None,
        trace_parent: None,
    }
}

async fn stored_texts(url: &str) -> i64 {
    scalar(url, "SELECT COUNT(*) FROM workflow_texts").await
}

async fn a_batch_of_one_text_stores_it_once_and_every_run_reads_it_back(db: TestDb) {
    let text = big_text("wf");
    let runs: Vec<NewRun> = (0..1_000)
        .map(|i| run_of(&format!("run_{i:04}"), &text))
        .collect();
    let got = db
        .ledger
        .enqueue_batch(runs, None, db.now())
        .await
        .expect("batch");
    assert_eq!(got.len(), 1_000);
    assert!(got.iter().all(|e| e.created && e.run.workflow_text == text));
    assert!(
        got.iter()
            .all(|e| e.run.workflow_hash == workflow_hash(&text))
    );
    // One stored copy, keyed by the text's SHA-256, and no copy on any run row.
    assert_eq!(stored_texts(&db.url).await, 1);
    let key = format!(
        "SELECT COUNT(*) FROM workflow_texts WHERE hash = '{}' AND LENGTH(text) = {}",
        workflow_hash(&text),
        text.len()
    );
    assert_eq!(scalar(&db.url, &key).await, 1);
    let inline = "SELECT COUNT(*) FROM runs WHERE workflow_text <> ''";
    assert_eq!(scalar(&db.url, inline).await, 0);
    // Every way a run is read back carries the full text.
    let listed = db
        .ledger
        .list_runs(RunFilter {
            limit: 1_000,
            ..Default::default()
        })
        .await
        .expect("list");
    assert_eq!(listed.len(), 1_000);
    assert!(listed.iter().all(|r| r.workflow_text == text));
    let w = worker("1");
    let claimed = db
        .ledger
        .claim_next_runs(
            ClaimRuns {
                worker: &w,
                lease: LEASE,
                limit: 1_000,
            },
            db.now(),
        )
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 1_000);
    assert!(claimed.iter().all(|c| c.run.workflow_text == text));
    let first = &claimed[0];
    let fin = RunFinish {
        status: RunStatus::Succeeded,
        output: Some(json!({})),
        error: None,
    };
    db.ledger
        .finish_run(&first.lease, fin, db.now())
        .await
        .expect("finish");
    let done = db.ledger.get_run(&first.run.id).await.expect("get");
    assert_eq!(done.workflow_text, text);
    let one = db.ledger.get_run(&claimed[1].run.id).await.expect("get");
    assert_eq!(one.workflow_text, text);
}

async fn two_texts_in_one_batch_are_two_rows(db: TestDb) {
    let (a, b) = (big_text("a"), big_text("b"));
    let runs: Vec<NewRun> = (0..10)
        .map(|i| run_of(&format!("run_{i}"), if i % 2 == 0 { &a } else { &b }))
        .collect();
    db.ledger
        .enqueue_batch(runs, None, db.now())
        .await
        .expect("batch");
    assert_eq!(stored_texts(&db.url).await, 2);
    for i in 0..10 {
        let run = db.ledger.get_run(&format!("run_{i}")).await.expect("get");
        let want = if i % 2 == 0 { &a } else { &b };
        assert_eq!(&run.workflow_text, want, "run_{i}");
    }
    // Texts differing by one byte are two rows: the key is the exact text's hash.
    let c = format!("{a} ");
    db.ledger
        .enqueue_batch(
            vec![run_of("run_a2", &a), run_of("run_c", &c)],
            None,
            db.now(),
        )
        .await
        .expect("batch");
    assert_eq!(stored_texts(&db.url).await, 3);
    let run = db.ledger.get_run("run_c").await.expect("get");
    assert_eq!(run.workflow_text, c);
}

async fn a_resubmit_still_compares_the_hash(db: TestDb) {
    let (a, b) = (big_text("a"), big_text("b"));
    let first = db
        .ledger
        .enqueue_batch(vec![run_of("run_x", &a)], None, db.now())
        .await
        .expect("batch");
    // The same id, text and inputs: the same run, nothing new stored.
    let again = db
        .ledger
        .enqueue_batch(vec![run_of("run_x", &a)], None, db.now())
        .await
        .expect("again");
    assert!(!again[0].created);
    assert_eq!(again[0].run.id, first[0].run.id);
    assert_eq!(again[0].run.workflow_text, a);
    assert_eq!(stored_texts(&db.url).await, 1);
    // Another text under the id: a conflict naming the workflow, in a batch (which is
    // rolled back whole, its new run included) and alone; the other text is not stored.
    let batch = vec![run_of("run_y", &a), run_of("run_x", &b)];
    match db.ledger.enqueue_batch(batch, None, db.now()).await {
        Err(Error::Conflict { reason, .. }) => assert!(reason.contains("workflow"), "{reason}"),
        other => panic!("expected Conflict, got {other:?}"),
    }
    match db.ledger.enqueue(run_of("run_x", &b), db.now()).await {
        Err(Error::Conflict { reason, .. }) => assert!(reason.contains("workflow"), "{reason}"),
        other => panic!("expected Conflict, got {other:?}"),
    }
    assert!(matches!(
        db.ledger.get_run("run_y").await,
        Err(Error::NotFound { .. })
    ));
    assert_eq!(stored_texts(&db.url).await, 1);
    assert_eq!(db.ledger.get_run("run_x").await.unwrap().workflow_text, a);
}

/// A batch is written a slice of runs per statement (1,000 a slice): more than a slice,
/// an id already queued and an id repeated inside the batch still answer in request
/// order, each new run once with its own `run.queued` event, in the batch's order.
async fn a_batch_answers_in_order_and_queues_each_new_run_once(db: TestDb) {
    let text = big_text("wf");
    db.ledger
        .enqueue(run_of("run_0005", &text), db.now())
        .await
        .expect("one run first");
    let mut runs: Vec<NewRun> = (0..1_500)
        .rev()
        .map(|i| run_of(&format!("run_{i:04}"), &text))
        .collect();
    // A repeat inside the batch, across the slice boundary and within one slice.
    runs.insert(1_200, run_of("run_1499", &text));
    runs.push(run_of("run_0001", &text));
    let got = db
        .ledger
        .enqueue_batch(runs.clone(), None, db.now())
        .await
        .expect("batch");
    let ids: Vec<&str> = got.iter().map(|e| e.run.id.as_str()).collect();
    let want: Vec<&str> = runs.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, want);
    let created: Vec<bool> = got.iter().map(|e| e.created).collect();
    for (i, run) in runs.iter().enumerate() {
        let first = runs.iter().position(|r| r.id == run.id) == Some(i);
        let expect = first && run.id != "run_0005";
        assert_eq!(created[i], expect, "{} at {i}", run.id);
        assert_eq!(got[i].run.workflow_text, text, "{}", run.id);
        assert_eq!(got[i].run.inputs, json!({"order": run.id}));
    }
    let queued: Vec<String> = db
        .ledger
        .list_events(EventFilter {
            limit: 5_000,
            ..Default::default()
        })
        .await
        .expect("events")
        .into_iter()
        .filter(|e| e.event_type == EventType::RunQueued)
        .filter_map(|e| e.run_id)
        .collect();
    let mut want: Vec<String> = vec!["run_0005".into()];
    want.extend(
        runs.iter()
            .enumerate()
            .filter(|(i, r)| created[*i] && r.id != "run_0005")
            .map(|(_, r)| r.id.clone()),
    );
    assert_eq!(queued.len(), 1_500);
    assert_eq!(queued, want, "one run.queued per new run, in batch order");
    assert_eq!(stored_texts(&db.url).await, 1);
}

async fn each_scope_stores_its_own_copy(db: TestDb) {
    let other = Ledger::open(
        &db.url,
        OpenOptions {
            scope: Scope {
                tenant: "acme".into(),
                workspace: "prod".into(),
            },
            ..OpenOptions::default()
        },
    )
    .await
    .expect("open");
    let text = big_text("wf");
    db.ledger
        .enqueue(run_of("run_a", &text), db.now())
        .await
        .unwrap();
    other
        .enqueue(run_of("run_b", &text), db.now())
        .await
        .unwrap();
    assert_eq!(stored_texts(&db.url).await, 2);
    assert_eq!(other.get_run("run_b").await.unwrap().workflow_text, text);
    other.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_runs_from_before_migration_0007_keep_their_inline_text() {
    runs_from_before_the_migration_keep_their_inline_text(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_runs_from_before_migration_0007_keep_their_inline_text() {
    runs_from_before_the_migration_keep_their_inline_text(Backend::Postgres).await;
}

/// Two runs as flow wrote them before migration 0007 (text inline, hash = SHA-256 of
/// it), on a database migrated to 0006 only.
fn old_runs_sql(text: &str) -> String {
    let inputs = json!({"order": 42});
    let mut sql = String::new();
    for id in ["run_old1", "run_old2"] {
        sql.push_str(&format!(
            "INSERT INTO runs (tenant, workspace, id, workflow_name, workflow_text,
                workflow_hash, inputs, inputs_hash, status, priority, not_before,
                created_at, updated_at)
             VALUES ('default', 'default', '{id}', 'wf', '{}', '{}', '{inputs}', '{}',
                'queued', 0, {t}, {t}, {t});\n",
            text.replace('\'', "''"),
            workflow_hash(text),
            canonical_hash(&inputs),
            t = T0.0,
        ));
    }
    sql
}

async fn runs_from_before_the_migration_keep_their_inline_text(backend: Backend) {
    let Some(empty) = empty_database(backend).await else {
        return;
    };
    let text = format!("{}# it's the old one\n", big_text("wf"));
    let sql = sqlx::AssertSqlSafe(old_runs_sql(&text));
    if backend == Backend::Sqlite {
        let url = format!("{}?mode=rwc", empty.url);
        let mut c = sqlx::SqliteConnection::connect(&url)
            .await
            .expect("connect");
        let old = sqlx::migrate!("../migrations/sqlite");
        old.run_to(6, &mut c).await.expect("migrate to 0006");
        sqlx::raw_sql(sql).execute(&mut c).await.expect("old rows");
        c.close().await.expect("close");
    } else {
        let mut c = sqlx::PgConnection::connect(&empty.url)
            .await
            .expect("connect");
        let old = sqlx::migrate!("../migrations/postgres");
        old.run_to(6, &mut c).await.expect("migrate to 0006");
        sqlx::raw_sql(sql).execute(&mut c).await.expect("old rows");
        c.close().await.expect("close");
    }
    // Opening migrates to 0007; the old rows are left as they are.
    let ledger = Ledger::open(&empty.url, options()).await.expect("open");
    assert_eq!(stored_texts(&empty.url).await, 0);
    let old = ledger.get_run("run_old1").await.expect("old run");
    assert_eq!(old.workflow_text, text);
    // Re-submitting the old run: the same text is the same run, another is a conflict.
    let mut same = run_of("run_old1", &text);
    same.inputs = json!({"order": 42});
    let now = Timestamp(T0.0 + 1_000);
    let enq = ledger.enqueue(same.clone(), now).await.expect("same");
    assert!(!enq.created);
    assert_eq!(enq.run.workflow_text, text);
    same.workflow_text.push('\n');
    assert!(matches!(
        ledger.enqueue(same, now).await,
        Err(Error::Conflict { .. })
    ));
    // A new run of the same text gets the shared copy; the old runs keep theirs.
    ledger
        .enqueue(run_of("run_new", &text), now)
        .await
        .expect("new");
    assert_eq!(stored_texts(&empty.url).await, 1);
    let w = worker("1");
    let claimed = ledger
        .claim_next_runs(
            ClaimRuns {
                worker: &w,
                lease: LEASE,
                limit: 10,
            },
            now,
        )
        .await
        .expect("claim");
    let ids: Vec<&str> = claimed.iter().map(|c| c.run.id.as_str()).collect();
    assert_eq!(ids, ["run_old1", "run_old2", "run_new"]);
    assert!(claimed.iter().all(|c| c.run.workflow_text == text));
    let inline = "SELECT COUNT(*) FROM runs WHERE workflow_text <> ''";
    assert_eq!(scalar(&empty.url, inline).await, 2);
    ledger.close().await;
}
