//! Connections (migration 0017, `ledger/src/connections.rs`): a refresh is leased on
//! the generation read, only the holder writes the next generation, an expired lease
//! can be taken over, a refused refresh token stops everyone (with one event), and a
//! new sign-in moves past any refresh leased on the old tokens; a sign-in begun on one
//! server (migration 0018) is taken by exactly one callback, and never once expired.

use std::time::Duration;

use flow_ledger::{
    ConnectionStatus, Endpoints, EventFilter, PendingSignIn, RefreshFailure, Sealed,
};

use crate::common::*;

crate::conformance!(
    one_holder_at_a_time_writes_the_next_generation,
    a_refused_refresh_stops_every_worker_until_a_new_sign_in,
    wanted_scopes_accumulate_and_deletion_returns_the_row,
    a_pending_sign_in_is_taken_once_and_never_after_it_expires,
);

fn endpoints() -> Endpoints {
    Endpoints {
        server: "http://127.0.0.1:1/mcp".into(),
        resource: "http://127.0.0.1:1/mcp".into(),
        issuer: Some("http://127.0.0.1:1".into()),
        token_endpoint: "http://127.0.0.1:1/token".into(),
        revocation_endpoint: None,
        client_id: "c".into(),
        auth_method: "none".into(),
    }
}

fn sealed(text: &str, expires: Option<flow_ledger::Timestamp>) -> Sealed {
    Sealed {
        sealed: text.into(),
        key_id: "k1".into(),
        scopes_granted: Some("a".into()),
        access_expires_at: expires,
        has_refresh: true,
    }
}

async fn one_holder_at_a_time_writes_the_next_generation(db: TestDb) {
    let l = &db.ledger;
    let now = db.now();
    let g = l
        .store_connection("tracker", endpoints(), sealed("s1", None), "ada", now)
        .await
        .unwrap();
    assert_eq!(g, 1);
    let until = now.plus(Duration::from_secs(60));
    let a = l
        .lease_connection_refresh("tracker", 1, "A", until, now)
        .await
        .unwrap();
    assert!(a.is_some(), "A leases generation 1");
    let b = l
        .lease_connection_refresh("tracker", 1, "B", until, now)
        .await
        .unwrap();
    assert!(b.is_none(), "B waits while A holds it");
    assert!(
        !l.finish_connection_refresh("tracker", "B", sealed("sB", None), now)
            .await
            .unwrap(),
        "only the holder writes"
    );
    assert!(
        l.finish_connection_refresh("tracker", "A", sealed("s2", None), now)
            .await
            .unwrap()
    );
    let c = l.connection("tracker").await.unwrap().expect("row");
    assert_eq!(
        (c.generation, c.sealed.sealed.as_str(), c.refreshes),
        (2, "s2", 1)
    );
    assert!(c.lease.is_none(), "released");
    // B read generation 1 before A finished: its lease is refused, it reads generation 2.
    let b = l
        .lease_connection_refresh("tracker", 1, "B", until, now)
        .await
        .unwrap();
    assert!(b.is_none(), "a stale generation is not leased");
    // A holder that died: its lease can be taken once it expires, not before.
    let short = now.plus(Duration::from_secs(1));
    assert!(
        l.lease_connection_refresh("tracker", 2, "A", short, now)
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        l.lease_connection_refresh("tracker", 2, "B", until, now)
            .await
            .unwrap()
            .is_none()
    );
    let later = db.advance(Duration::from_secs(2));
    let b = l
        .lease_connection_refresh(
            "tracker",
            2,
            "B",
            later.plus(Duration::from_secs(60)),
            later,
        )
        .await
        .unwrap();
    assert!(b.is_some(), "taken over after expiry");
    assert!(
        !l.finish_connection_refresh("tracker", "A", sealed("late", None), later)
            .await
            .unwrap(),
        "the old holder lost it"
    );
    // A new sign-in moves past the leased refresh: its holder cannot write.
    let g = l
        .store_connection("tracker", endpoints(), sealed("signin", None), "bob", later)
        .await
        .unwrap();
    assert_eq!(g, 3);
    assert!(
        !l.finish_connection_refresh("tracker", "B", sealed("x", None), later)
            .await
            .unwrap()
    );
    let c = l.connection("tracker").await.unwrap().expect("row");
    assert_eq!(
        (c.sealed.sealed.as_str(), c.connected_by.as_str()),
        ("signin", "bob")
    );
}

async fn a_refused_refresh_stops_every_worker_until_a_new_sign_in(db: TestDb) {
    let l = &db.ledger;
    let now = db.now();
    l.store_connection("tracker", endpoints(), sealed("s1", Some(now)), "ada", now)
        .await
        .unwrap();
    let until = now.plus(Duration::from_secs(60));
    // A transient failure releases the lease and keeps the connection usable.
    assert!(
        l.lease_connection_refresh("tracker", 1, "A", until, now)
            .await
            .unwrap()
            .is_some()
    );
    let (t, t_error) = (RefreshFailure::Transient, "HTTP 503");
    assert!(
        l.fail_connection_refresh("tracker", "A", t, t_error, now)
            .await
            .unwrap()
    );
    let c = l.connection("tracker").await.unwrap().expect("row");
    assert_eq!(c.status, ConnectionStatus::Connected);
    assert_eq!(c.last_error.as_deref(), Some("HTTP 503"));
    // invalid_grant: needs a new sign-in, one event; no one can lease it any more.
    assert!(
        l.lease_connection_refresh("tracker", 1, "B", until, now)
            .await
            .unwrap()
            .is_some()
    );
    let (dead, dead_error) = (RefreshFailure::NeedsReconnect, "invalid_grant");
    assert!(
        !l.fail_connection_refresh("tracker", "A", dead, dead_error, now)
            .await
            .unwrap(),
        "not A's"
    );
    assert!(
        l.fail_connection_refresh("tracker", "B", dead, dead_error, now)
            .await
            .unwrap()
    );
    let c = l.connection("tracker").await.unwrap().expect("row");
    assert_eq!(c.status, ConnectionStatus::NeedsReconnect);
    assert!(
        l.lease_connection_refresh("tracker", 1, "C", until, now)
            .await
            .unwrap()
            .is_none()
    );
    let events = l.list_events(EventFilter::default()).await.unwrap();
    let emitted: Vec<_> = events
        .iter()
        .filter(|e| e.event_type.as_str() == "connection.needs_reconnect")
        .collect();
    assert_eq!(emitted.len(), 1);
    assert_eq!(emitted[0].payload["connection"], "tracker");
    assert!(emitted[0].run_id.is_none());
    // A new sign-in makes it usable again.
    l.store_connection("tracker", endpoints(), sealed("s2", None), "ada", now)
        .await
        .unwrap();
    let c = l.connection("tracker").await.unwrap().expect("row");
    assert_eq!(
        (c.status, c.last_error),
        (ConnectionStatus::Connected, None)
    );
}

async fn wanted_scopes_accumulate_and_deletion_returns_the_row(db: TestDb) {
    let l = &db.ledger;
    let now = db.now();
    assert!(!l.want_connection_scope("nope", "a").await.unwrap());
    l.store_connection("tracker", endpoints(), sealed("s1", None), "ada", now)
        .await
        .unwrap();
    assert!(l.want_connection_scope("tracker", "x").await.unwrap());
    assert!(l.want_connection_scope("tracker", "y x").await.unwrap());
    let c = l.connection("tracker").await.unwrap().expect("row");
    assert_eq!(c.scopes_wanted.as_deref(), Some("x y"));
    l.store_connection("other", endpoints(), sealed("s", None), "ada", now)
        .await
        .unwrap();
    let names: Vec<String> = l
        .list_connections()
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(names, ["other", "tracker"]);
    let gone = l
        .delete_connection("tracker")
        .await
        .unwrap()
        .expect("was there");
    assert_eq!(gone.scopes_wanted.as_deref(), Some("x y"));
    assert!(l.connection("tracker").await.unwrap().is_none());
    assert!(l.delete_connection("tracker").await.unwrap().is_none());
}

fn pending(name: &str, expires_at: flow_ledger::Timestamp) -> PendingSignIn {
    PendingSignIn {
        name: name.into(),
        sealed: format!("sealed-{name}"),
        key_id: "k1".into(),
        begun_by: "ada".into(),
        expires_at,
    }
}

async fn a_pending_sign_in_is_taken_once_and_never_after_it_expires(db: TestDb) {
    let l = &db.ledger;
    let now = db.now();
    let later = now.plus(Duration::from_secs(600));
    l.put_pending_sign_in("h1", pending("tracker", later), now)
        .await
        .unwrap();
    l.put_pending_sign_in("h2", pending("wiki", now.plus(Duration::from_secs(1))), now)
        .await
        .unwrap();
    // Two callbacks with the same state at once: exactly one gets the row.
    let (a, b) = tokio::join!(
        l.take_pending_sign_in("h1", now),
        l.take_pending_sign_in("h1", now)
    );
    let got: Vec<PendingSignIn> = [a.unwrap(), b.unwrap()].into_iter().flatten().collect();
    assert_eq!(got, vec![pending("tracker", later)]);
    assert_eq!(l.take_pending_sign_in("h1", now).await.unwrap(), None);
    assert_eq!(l.take_pending_sign_in("nope", now).await.unwrap(), None);
    // Past its expiry: refused (and gone).
    let after = now.plus(Duration::from_secs(2));
    assert_eq!(l.take_pending_sign_in("h2", after).await.unwrap(), None);
    assert_eq!(l.take_pending_sign_in("h2", now).await.unwrap(), None);
    // A new sign-in sweeps the rows that expired before it.
    l.put_pending_sign_in("h3", pending("wiki", now.plus(Duration::from_secs(1))), now)
        .await
        .unwrap();
    l.put_pending_sign_in("h4", pending("tracker", later), after)
        .await
        .unwrap();
    assert_eq!(
        l.take_pending_sign_in("h3", now).await.unwrap(),
        None,
        "swept"
    );
    assert!(l.take_pending_sign_in("h4", after).await.unwrap().is_some());
}
