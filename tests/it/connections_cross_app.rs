//! Cross-app access (SEP-990) through the real binary: `flow connect` trades the
//! person's ID token at the identity provider (RFC 8693) for an ID-JAG and that at the
//! authorization server (RFC 7523 JWT bearer, client authenticated) for the tokens a run
//! then uses; a missing or refused ID token stores nothing, and no token or ID token is
//! left in the ledger's files or a trace-level log.

use flow_adapters::testkit::mcp::{AuthOptions, HttpServer};

use crate::connections::{assert_no_token, disk_bytes, flow_with, key, listed, workflow};
use crate::support::{Backend, TestDb, backends, output, runtime, stderr, stdout};

const ID_TOKEN: &str = "eyJhbGciOiJFUzI1NiJ9.person-id-token.sig";

fn config(db: &TestDb, server: &HttpServer) {
    db.write(
        "flow.toml",
        &format!(
            "[[connections]]\nname = \"tracker\"\nserver = \"{}\"\nclient_id = \"flow\"\nclient_secret_name = \"TRACKER_CLIENT\"\nscopes = [\"tools:write\"]\n\n[connections.cross_app]\nidp_token_endpoint = \"{}\"\nidp_client_id = \"flow-at-idp\"\nid_token_secret = \"IDP_ID_TOKEN\"\n",
            server.url(),
            server.idp_token_url()
        ),
    );
}

fn connect(db: &TestDb, key: &str, id_token: Option<&str>) -> std::process::Output {
    let mut cmd = flow_with(db, key);
    cmd.args(["connect", "tracker", "--by", "ada"])
        .env("FLOW_SECRET_TRACKER_CLIENT", "flow-secret")
        .env("RUST_LOG", "trace");
    if let Some(t) = id_token {
        cmd.env("FLOW_SECRET_IDP_ID_TOKEN", t);
    }
    output(&mut cmd)
}

#[test]
fn an_id_token_becomes_a_connection_without_a_browser() {
    let rt = runtime();
    for backend in backends() {
        let server = rt
            .block_on(HttpServer::start(Some(AuthOptions::default())))
            .expect("server");
        server.set_id_token(Some(ID_TOKEN));
        let db = TestDb::new(backend);
        let key = key();
        config(&db, &server);

        // No ID token: refused before anything is asked.
        let out = connect(&db, &key, None);
        assert_eq!(out.status.code(), Some(5), "{backend:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("IDP_ID_TOKEN"), "{}", stderr(&out));
        assert_eq!(server.cross_app().exchanges(), 0);
        // A wrong (expired, revoked) ID token: the identity provider refuses, exit 2,
        // nothing stored.
        let out = connect(&db, &key, Some("not-the-token"));
        assert_eq!(out.status.code(), Some(2), "{backend:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("the identity provider refused"),
            "{}",
            stderr(&out)
        );
        assert_eq!(server.cross_app().bearer_grants(), 0);
        assert!(listed(&db, &key).as_array().is_some_and(Vec::is_empty));

        let out = connect(&db, &key, Some(ID_TOKEN));
        assert_eq!(out.status.code(), Some(0), "{backend:?}: {}", stderr(&out));
        assert!(
            stdout(&out).contains("connected `tracker`"),
            "{}",
            stdout(&out)
        );
        let x = server.cross_app();
        assert_eq!(
            (x.exchanges(), x.bearer_grants(), x.refused()),
            (2, 1, 1),
            "one refused exchange, then one exchange and one bearer grant"
        );
        assert_eq!(server.auth_code().code_requests(), 0, "no browser grant");
        assert_eq!(x.idp_clients(), ["flow-at-idp", "flow-at-idp"]);
        let list = listed(&db, &key);
        assert_eq!(
            (list[0]["status"].as_str(), list[0]["scopes"].as_str()),
            (Some("connected"), Some("tools:write")),
            "{list}"
        );
        let connect_log = out.stderr;

        let wf = workflow(&db, &server.url(), "xaa", 1);
        let out = output(
            flow_with(&db, &key)
                .arg("run")
                .arg(&wf)
                .env("RUST_LOG", "trace"),
        );
        assert_eq!(out.status.code(), Some(0), "{backend:?}: {}", stderr(&out));
        assert_eq!(server.stats().count("xaa-0"), 1);

        let mut secrets = server.auth_code().all_tokens();
        secrets.push(ID_TOKEN.to_string());
        assert!(secrets.iter().any(|t| t.starts_with("jag-")), "{secrets:?}");
        assert_no_token("flow connect's trace log", &connect_log, &secrets);
        assert_no_token("flow run's trace log", &out.stderr, &secrets);
        if backend == Backend::Sqlite {
            assert_no_token("the ledger files", &disk_bytes(db.dir.path()), &secrets);
        }
    }
}

/// An installation error (exit 5, as for any bad flow.toml) naming the file.
#[test]
fn cross_app_without_a_client_is_refused_on_load() {
    let db = TestDb::new(Backend::Sqlite);
    db.write(
        "flow.toml",
        "[[connections]]\nname = \"tracker\"\nserver = \"http://127.0.0.1:9/mcp\"\n\n[connections.cross_app]\nidp_token_endpoint = \"http://127.0.0.1:9/idp/token\"\nidp_client_id = \"x\"\nid_token_secret = \"IDP_ID_TOKEN\"\n",
    );
    let out = output(flow_with(&db, &key()).args(["connect", "tracker"]));
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("`cross_app` needs `client_id`")
            && stderr(&out).contains("flow.toml"),
        "{}",
        stderr(&out)
    );
}
