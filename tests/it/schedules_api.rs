//! Schedules through `flow serve`: `GET /api/v1/schedules` for viewers; pause, resume
//! and trigger for operators (a viewer gets 403, an unknown id 404), recorded with the
//! token's name; and the console's Schedules page over plain HTTP — an operator's
//! Pause / Resume / Run now forms work (CSRF-checked), a viewer sees none and a crafted
//! POST of theirs is 403.

use reqwest::StatusCode;
use serde_json::Value;

use crate::api::{OPERATOR, Server, TOKENS, VIEWER, call, start};
use crate::support::{Backend, TestDb, output, runtime, stdout};
use crate::ui::http_session;

const QUICK: &str = "name: tick\ninputs:\n  at: { type: string, required: true }\ntools:\n  echo: { kind: function, function: core.echo }\nnodes:\n  a: { tool: echo, with: { at: \"${{ inputs.at }}\" } }\n";

fn server(db: &TestDb) -> Server {
    db.write("w.yaml", QUICK);
    db.write(
        "flow.toml",
        &format!(
            "{TOKENS}\n[[schedules]]\nid = \"nightly\"\nworkflow = \"w.yaml\"\ncron = \"0 2 * * *\"\ntimezone = \"Europe/Paris\"\ninputs = {{ at = \"${{{{ schedule.time }}}}\" }}\n"
        ),
    );
    let mut cmd = db.flow();
    cmd.args(["serve", "--addr", "127.0.0.1:0"])
        .env("FLOW_SECRET_VIEWER_TOKEN", VIEWER)
        .env("FLOW_SECRET_OPERATOR_TOKEN", OPERATOR)
        .env("FLOW_SECRET_ADMIN_TOKEN", crate::api::ADMIN);
    start(cmd, "listening on ")
}

#[test]
fn the_api_lists_pauses_resumes_and_triggers_by_role() {
    let db = TestDb::new(Backend::Sqlite);
    let server = server(&db);
    runtime().block_on(async {
        let (status, body) = call(&server, "GET", "/api/v1/schedules", Some(VIEWER), None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let s = &body["schedules"][0];
        assert_eq!(
            (s["id"].as_str(), s["paused"].as_bool()),
            (Some("nightly"), Some(false)),
            "{body}"
        );
        assert!(s["next_tick"].is_string(), "{body}");
        let pause = "/api/v1/schedules/nightly/pause";
        let (status, _) = call(&server, "POST", pause, Some(VIEWER), None).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        let (status, body) = call(&server, "POST", pause, Some(OPERATOR), None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(
            (body["paused"].as_bool(), body["next_tick"].is_null()),
            (Some(true), true),
            "{body}"
        );
        let (status, _) = call(
            &server,
            "POST",
            "/api/v1/schedules/nope/pause",
            Some(OPERATOR),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        let (status, body) = call(
            &server,
            "POST",
            "/api/v1/schedules/nightly/trigger",
            Some(OPERATOR),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let run = body["run"].as_str().unwrap_or_default().to_string();
        assert!(run.starts_with("sched.nightly.manual."), "{body}");
        assert_eq!(body["schedule"]["last_run"]["run"], run.as_str(), "{body}");
        let (status, body) = call(
            &server,
            "POST",
            "/api/v1/schedules/nightly/resume",
            Some(OPERATOR),
            None,
        )
        .await;
        assert_eq!(
            (status, body["paused"].as_bool()),
            (StatusCode::OK, Some(false)),
            "{body}"
        );
    });
    let out = output(
        db.flow()
            .args(["schedules", "history", "nightly", "--json"]),
    );
    let h: Value = serde_json::from_str(&stdout(&out)).expect("history json");
    let by: Vec<(&str, &str)> = h
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| Some((e["outcome"].as_str()?, e["by"].as_str()?)))
        .collect();
    for outcome in ["paused", "triggered", "resumed"] {
        assert!(by.contains(&(outcome, "otto")), "{outcome} by otto: {h}");
    }
}

#[test]
fn the_console_page_pauses_resumes_and_runs_now_for_operators_only() {
    let db = TestDb::new(Backend::Sqlite);
    let server = server(&db);
    runtime().block_on(async {
        let otto = http_session(&server, OPERATOR).await;
        let get = |s: &(reqwest::Client, String, String)| {
            let req =
                s.0.get(format!("{}/ui/schedules", server.base))
                    .header("cookie", &s.1);
            async move {
                let resp = req.send().await.expect("get");
                (resp.status(), resp.text().await.expect("body"))
            }
        };
        let (status, page) = get(&otto).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        assert!(page.contains("nightly") && page.contains("Paris"), "{page}");
        assert!(
            page.contains(">Pause<") && page.contains(">Run now<"),
            "{page}"
        );
        let post = |s: &(reqwest::Client, String, String), action: &str, csrf: Option<&str>| {
            let form: Vec<(&str, String)> =
                vec![("csrf", csrf.map_or_else(|| s.2.clone(), str::to_string))];
            let req =
                s.0.post(format!("{}/ui/schedules/nightly/{action}", server.base))
                    .header("cookie", &s.1)
                    .form(&form);
            async move { req.send().await.expect("post").status() }
        };
        assert_eq!(
            post(&otto, "pause", Some("forged")).await,
            StatusCode::FORBIDDEN
        );
        assert_eq!(post(&otto, "pause", None).await, StatusCode::SEE_OTHER);
        let (_, page) = get(&otto).await;
        assert!(
            page.contains(">Resume<") && page.contains("paused"),
            "{page}"
        );
        assert_eq!(post(&otto, "resume", None).await, StatusCode::SEE_OTHER);
        assert_eq!(post(&otto, "trigger", None).await, StatusCode::SEE_OTHER);
        let (_, page) = get(&otto).await;
        assert!(
            page.contains("sched.nightly.manual."),
            "the last run links the run: {page}"
        );
        let vera = http_session(&server, VIEWER).await;
        let (status, page) = get(&vera).await;
        assert_eq!(status, StatusCode::OK);
        assert!(!page.contains(">Run now<"), "a viewer gets no form: {page}");
        assert_eq!(post(&vera, "pause", None).await, StatusCode::FORBIDDEN);
    });
}
