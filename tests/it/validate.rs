//! `flow validate`, `flow graph` and `flow schema` through the real binary.
//!
//! Golden files: each `workflows/invalid/X.yaml` has `X.expected`, the exact stderr of
//! `flow validate workflows/invalid/X.yaml`. Set `FLOW_BLESS=1` to rewrite them after a
//! deliberate change of wording, then review the diff (under `CI` that is a failure).

use crate::support::{Backend, TestDb, files, flow, output, repo, stderr, stdout};

#[test]
fn every_example_workflow_validates() {
    let examples = files(&repo().join("workflows"), "yaml");
    assert!(
        examples.len() >= 6,
        "expected the six examples, found {examples:?}"
    );
    let mut cmd = flow();
    cmd.arg("validate");
    for f in &examples {
        cmd.arg(f.strip_prefix(repo()).unwrap_or(f));
    }
    let out = output(&mut cmd);
    assert_eq!(out.status.code(), Some(0), "stderr:\n{}", stderr(&out));
    assert_eq!(stdout(&out).lines().count(), examples.len());
}

#[test]
fn every_invalid_workflow_gives_exactly_its_golden_diagnostics() {
    let invalid = files(&repo().join("workflows/invalid"), "yaml");
    assert!(invalid.len() >= 10, "found {invalid:?}");
    let mut failures = Vec::new();
    for file in invalid {
        let rel = file.strip_prefix(repo()).unwrap_or(&file).to_path_buf();
        let out = output(flow().arg("validate").arg(&rel));
        let golden = file.with_extension("expected");
        let got = stderr(&out);
        if out.status.code() != Some(2) {
            failures.push(format!(
                "{}: exit {:?}, want 2",
                rel.display(),
                out.status.code()
            ));
        }
        if !stdout(&out).is_empty() {
            failures.push(format!("{}: stdout should be empty", rel.display()));
        }
        if let Err(diff) = crate::support::golden(&golden, &got) {
            failures.push(format!("{}:\n{diff}", rel.display()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `FLOW_BLESS` under `CI` fails the golden test instead of rewriting the goldens: this
/// test binary runs the golden test again with both set, and nothing may change.
#[test]
fn bless_under_ci_fails_and_rewrites_nothing() {
    if flow_adapters::testkit::flags::env_flag("FLOW_BLESS") {
        // This very run rewrites the goldens, concurrently: "nothing changed" cannot hold.
        eprintln!("skipped: FLOW_BLESS is set for this run");
        return;
    }
    let goldens = files(&repo().join("workflows/invalid"), "expected");
    let read_all = || -> Vec<String> {
        goldens
            .iter()
            .map(|g| std::fs::read_to_string(g).unwrap_or_else(|e| panic!("{}: {e}", g.display())))
            .collect()
    };
    let before = read_all();
    let exe = std::env::current_exe().expect("this test binary");
    let out = output(
        std::process::Command::new(exe)
            .args([
                "--exact",
                "validate::every_invalid_workflow_gives_exactly_its_golden_diagnostics",
            ])
            .env("FLOW_BLESS", "1")
            .env("CI", "1"),
    );
    let said = format!("{}{}", stdout(&out), stderr(&out));
    assert!(!out.status.success(), "bless under CI passed:\n{said}");
    assert!(said.contains("FLOW_BLESS is set under CI"), "{said}");
    assert!(
        said.contains("1 failed"),
        "the golden test did not run:\n{said}"
    );
    assert!(read_all() == before, "a golden was rewritten under CI");
}

#[test]
fn several_files_report_all_problems_and_exit_2() {
    let out = output(flow().args([
        "validate",
        "workflows/hello.yaml",
        "workflows/invalid/cycle.yaml",
        "workflows/invalid/unknown_keys.yaml",
    ]));
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("workflows/invalid/cycle.yaml:5:3: error: dependency cycle: alpha -> beta -> gamma -> alpha"), "{err}");
    assert!(
        err.contains("workflows/invalid/unknown_keys.yaml:7:5: error: unknown key `retry_polcy`"),
        "{err}"
    );
    assert!(stdout(&out).contains("workflows/hello.yaml: ok"));
}

#[test]
fn missing_and_oversized_files_are_refused_cleanly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let big = dir.path().join("big.yaml");
    let mut text = String::from("nodes:\n");
    while text.len() <= 1024 * 1024 {
        text.push_str("  # padding padding padding padding padding padding padding padding\n");
    }
    std::fs::write(&big, text).expect("write");
    let out = output(
        flow()
            .arg("validate")
            .arg(&big)
            .arg(dir.path().join("nope.yaml")),
    );
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("big.yaml:1:1: error: the file is")
            && err.contains("limited to 1048576 bytes"),
        "{err}"
    );
    assert!(
        err.contains("nope.yaml:1:1: error: cannot read the file"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn graph_draws_mermaid_and_dot() {
    let out = output(flow().args(["graph", "workflows/fan_out_fan_in.yaml"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let m = stdout(&out);
    assert!(m.starts_with("flowchart TD\n"), "{m}");
    for branch in ["inventory", "pricing", "fraud", "shipping", "tax"] {
        assert!(m.contains(&format!("n_start --> n_{branch}")), "{m}");
        assert!(m.contains(&format!("n_{branch} --> n_done")), "{m}");
    }
    let out = output(flow().args(["graph", "workflows/hello.yaml", "--format", "dot"]));
    assert_eq!(out.status.code(), Some(0));
    assert!(
        stdout(&out).contains("\"greet\" -> \"summary\";"),
        "{}",
        stdout(&out)
    );
    let out = output(flow().args(["graph", "workflows/invalid/cycle.yaml"]));
    assert_eq!(out.status.code(), Some(2));
    assert!(stdout(&out).is_empty());
}

#[test]
fn the_committed_schema_is_current() {
    let out = output(flow().arg("schema"));
    assert_eq!(out.status.code(), Some(0));
    let committed = std::fs::read_to_string(repo().join("workflows/schema.json"))
        .expect("workflows/schema.json");
    assert!(
        stdout(&out) == committed,
        "workflows/schema.json is stale: run `cargo run -- schema > workflows/schema.json`"
    );
}

#[test]
fn examples_name_and_conform_to_the_schema_and_unknown_keys_do_not() {
    let schema: serde_json::Value =
        serde_json::from_str(&flow::schema::workflow_schema_text()).expect("schema is JSON");
    let validator = jsonschema::validator_for(&schema).expect("schema compiles");
    for file in files(&repo().join("workflows"), "yaml") {
        let text = std::fs::read_to_string(&file).expect("read");
        // Editors with the YAML language server complete and check keys from it.
        assert!(
            text.starts_with("# yaml-language-server: $schema=./schema.json\n"),
            "{}: the first line points editors at the schema",
            file.display()
        );
        let value: serde_json::Value = yaml_serde::from_str(&text).expect("yaml");
        let errors: Vec<String> = validator
            .iter_errors(&value)
            .map(|e| e.to_string())
            .collect();
        assert!(errors.is_empty(), "{}: {errors:?}", file.display());
    }
    let text =
        std::fs::read_to_string(repo().join("workflows/invalid/unknown_keys.yaml")).expect("read");
    let value: serde_json::Value = yaml_serde::from_str(&text).expect("yaml");
    assert!(
        !validator.is_valid(&value),
        "the schema must reject unknown keys"
    );
}

#[test]
fn help_has_an_example_for_every_command() {
    for cmd in ["validate", "graph", "schema"] {
        let out = output(flow().args([cmd, "--help"]));
        assert_eq!(out.status.code(), Some(0));
        assert!(
            stdout(&out).contains("Example"),
            "{cmd} --help:\n{}",
            stdout(&out)
        );
    }
    let out = output(flow().arg("--bogus"));
    assert_eq!(out.status.code(), Some(2));
}

/// Counts in messages agree with their nouns ("1 node", not "1 nodes").
#[test]
fn validate_counts_in_the_singular_and_plural() {
    let db = TestDb::new(Backend::Sqlite);
    let one = db.write(
        "one.yaml",
        "name: one\ntools:\n  t: { kind: function, function: core.echo }\nnodes:\n  a: { tool: t }\n",
    );
    let out = output(flow().arg("validate").arg(&one));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("ok (1 node, 1 tool)"),
        "{}",
        stdout(&out)
    );
    let hello = repo().join("workflows/hello.yaml");
    let out = output(flow().arg("validate").arg(&hello));
    assert!(stdout(&out).contains("nodes, "), "{}", stdout(&out));
}

/// `flow validate DIR` checks every `*.yaml` directly in it; `flow validate -` reads
/// standard input (bounded like a file) and names it `<stdin>` in diagnostics.
#[test]
fn validate_reads_directories_and_standard_input() {
    let out = output(flow().arg("validate").arg(repo().join("workflows")));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("hello.yaml: ok"), "{}", stdout(&out));
    assert!(
        !stdout(&out).contains("invalid/"),
        "not recursive: {}",
        stdout(&out)
    );
    let empty = TestDb::new(Backend::Sqlite);
    let out = output(flow().arg("validate").arg(empty.dir.path()));
    assert_eq!(out.status.code(), Some(2), "an empty directory is an error");
    let piped = |input: &[u8]| {
        use std::io::Write;
        let mut child = flow()
            .args(["validate", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn");
        let mut stdin = child.stdin.take().expect("stdin");
        let input = input.to_vec();
        let feeder = std::thread::spawn(move || {
            let _ = stdin.write_all(&input);
        });
        let out = child.wait_with_output().expect("wait");
        let _ = feeder.join();
        out
    };
    let hello = std::fs::read(repo().join("workflows/hello.yaml")).expect("hello");
    let out = piped(&hello);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).starts_with("<stdin>: ok"), "{}", stdout(&out));
    let out = piped(b"name: x\nnodes: [\n");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).starts_with("<stdin>:3:1: error"),
        "{}",
        stderr(&out)
    );
    let out = piped(&vec![b'#'; 3 * 1024 * 1024]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("limited to 1048576 bytes"),
        "{}",
        stderr(&out)
    );
}

/// Every string field a workflow can hold either evaluates `${{ }}` (and then checks what
/// the expression reads) or refuses it: none keeps it as literal text. The test walks
/// every string value of the examples and of a file that uses the rarer keys
/// (`elicitation.accept`, input defaults, reconcile, auth), puts an expression reading an
/// undeclared input there, and requires `flow validate`'s checks to fail.
#[test]
fn no_string_field_keeps_an_expression_as_literal_text() {
    const EXPR: &str = "${{ inputs.zz_not_declared }}";
    let mut docs: Vec<(String, String)> = files(&repo().join("workflows"), "yaml")
        .into_iter()
        .map(|f| {
            // The text a run stores: a workflow with sub-workflows carries them under
            // `included:` (their texts are string fields too).
            let opts = flow::workflow::ValidateOptions::default();
            let (_, source) = flow::workflow::load_file(&f, &opts)
                .unwrap_or_else(|d| panic!("{}: {d}", f.display()));
            (f.display().to_string(), source.text)
        })
        .collect();
    docs.push(("rare keys".into(), RARE_KEYS.into()));
    let mut walked = 0;
    let mut kept = Vec::new();
    for (name, text) in &docs {
        flow::workflow::parse_str(text, name).unwrap_or_else(|d| panic!("{name}: {d:?}"));
        let doc: yaml_serde::Value = yaml_serde::from_str(text).expect("yaml");
        let mut paths = Vec::new();
        string_leaves(&doc, &mut Vec::new(), &mut paths);
        for path in paths {
            let mut mutated = doc.clone();
            set_leaf(&mut mutated, &path, EXPR);
            let text = yaml_serde::to_string(&mutated).expect("yaml out");
            walked += 1;
            if flow::workflow::parse_str(&text, name).is_ok() {
                kept.push(format!("{name}: {}", path.join(".")));
            }
        }
    }
    assert!(walked > 100, "walked only {walked} fields");
    assert!(
        kept.is_empty(),
        "these fields keep `${{{{` as literal text:\n{}",
        kept.join("\n")
    );
}

/// A workflow with the keys the examples do not use.
const RARE_KEYS: &str = r#"
name: rare
inputs:
  who: { type: string, default: "ada", description: "free ${{ text }}" }
  tags: { type: array, default: ["a", "b"] }
tools:
  ask:
    kind: mcp
    server: { command: ["flow-testkit", "mcp-stdio"] }
    tool: ask
    elicitation: { accept: { confirm: "yes", note: "ok" } }
  pay:
    kind: http
    method: POST
    url: "https://pay.example/charges"
    headers: { X-Who: "${{ inputs.who }}" }
    reconcile:
      request: { method: GET, url: "https://pay.example/charges/${{ call.key }}" }
      found: "${{ response.status == 200 }}"
      not_found: "${{ response.status == 404 }}"
nodes:
  a: { tool: ask, with: { q: "${{ inputs.who }}" } }
  b: { needs: [a], tool: pay, with: { amount: 1 } }
"#;

fn string_leaves(v: &yaml_serde::Value, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match v {
        yaml_serde::Value::String(_) if path.last().is_none_or(|k| k != "description") => {
            out.push(path.clone());
        }
        yaml_serde::Value::Sequence(items) => {
            for (i, item) in items.iter().enumerate() {
                path.push(i.to_string());
                string_leaves(item, path, out);
                path.pop();
            }
        }
        yaml_serde::Value::Mapping(map) => {
            for (k, item) in map {
                path.push(k.as_str().unwrap_or_default().to_string());
                string_leaves(item, path, out);
                path.pop();
            }
        }
        _ => {}
    }
}

fn set_leaf(v: &mut yaml_serde::Value, path: &[String], to: &str) {
    let Some((first, rest)) = path.split_first() else {
        *v = yaml_serde::Value::String(to.to_string());
        return;
    };
    let next = match v {
        yaml_serde::Value::Sequence(items) => {
            first.parse::<usize>().ok().and_then(|i| items.get_mut(i))
        }
        yaml_serde::Value::Mapping(map) => map.get_mut(first.as_str()),
        _ => None,
    };
    if let Some(next) = next {
        set_leaf(next, rest, to);
    }
}
