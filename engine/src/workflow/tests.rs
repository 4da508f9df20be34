//! Unit tests of validation: each diagnostic, data-driven.

use super::*;

/// Validates `text` and returns the rendered diagnostics (empty when valid).
fn diags(text: &str) -> String {
    match parse_str(text, "w.yaml") {
        Ok(_) => String::new(),
        Err(d) => d.to_string(),
    }
}

const TOOLS: &str = "tools:\n  t: { kind: function, function: core.echo }\n";

fn check(nodes: &str, expected: &[&str]) {
    let text = format!("{TOOLS}nodes:\n{nodes}");
    let out = diags(&text);
    for e in expected {
        assert!(out.contains(e), "expected {e:?} in:\n{out}\nfor:\n{text}");
    }
    if expected.is_empty() {
        assert_eq!(out, "", "for:\n{text}");
    }
}

#[test]
fn a_minimal_workflow_is_valid() {
    check("  a: { tool: t }\n", &[]);
}

#[test]
fn unknown_keys_suggest_the_nearest() {
    check(
        "  a:\n    tool: t\n    retry_polcy: { max_retries: 1 }\n",
        &[
            "w.yaml:6:5: error: unknown key `retry_polcy` in node `a`",
            "help: did you mean `retry_policy`?",
        ],
    );
}

#[test]
fn duplicate_node_ids() {
    check(
        "  a: { tool: t }\n  a: { tool: t }\n",
        &["w.yaml:5:3: error: duplicate node id `a`"],
    );
}

#[test]
fn unknown_needs_and_tools() {
    check(
        "  alpha: { tool: t }\n  b: { tool: tt, needs: [alpah] }\n",
        &[
            "error: node `b` uses unknown tool `tt`",
            "help: did you mean `t`?",
            "error: node `b` needs unknown node `alpah`",
            "help: did you mean `alpha`?",
        ],
    );
}

#[test]
fn reserved_retry_suffix() {
    check(
        "  charge_retry2: { tool: t }\n",
        &["node id `charge_retry2` ends in `_retry2`"],
    );
}

#[test]
fn cycles_are_named_in_order() {
    check(
        "  alpha: { tool: t, needs: [gamma] }\n  beta: { tool: t, needs: [alpha] }\n  gamma: { tool: t, needs: [beta] }\n  ok: { tool: t }\n",
        &["w.yaml:4:3: error: dependency cycle: alpha -> beta -> gamma -> alpha"],
    );
    check(
        "  a: { tool: t, needs: [a] }\n",
        &["dependency cycle: a -> a"],
    );
}

#[test]
fn expressions_must_parse_and_reference_known_things() {
    check(
        "  a: { tool: t, with: { x: \"${{ 1 + }}\" } }\n",
        &["invalid expression `1 +`"],
    );
    check(
        "  a: { tool: t, with: { x: \"${{ inputs.nope }}\" } }\n",
        &["reads unknown input `nope`"],
    );
    check(
        "  a: { tool: t }\n  b: { tool: t, with: { x: \"${{ nodes.c.output }}\" } }\n  c: { tool: t, needs: [a] }\n",
        &["reads node `c`, which is not an ancestor of `b`"],
    );
    check(
        "  a: { tool: t }\n  b: { tool: t, needs: [a], with: { x: \"${{ nodes.a.output.x }}\" } }\n",
        &[],
    );
    check(
        "  a: { tool: t }\n  b: { tool: t, needs: [a], if: \"${{ secrets.TOKEN }}\" }\n",
        &["reads a secret; secrets are only visible in `with` and tool specs"],
    );
    check(
        "  a: { tool: t, with: { x: \"${{ secrets.TOKEN }}\" } }\n",
        &[],
    );
    check(
        "  a: { tool: t, with: { x: \"${{ foo.bar }}\" } }\n",
        &["reads unknown name `foo`"],
    );
    check(
        "  a: { tool: t, with: { x: \"${{ with.y }}\" } }\n",
        &["reads `with`, which only tool specs can see"],
    );
    check("  a: { tool: t, with: { x: \"${{ run.id }}\" } }\n", &[]);
}

#[test]
fn durations_and_counts() {
    check(
        "  a: { tool: t, timeout: 30 }\n",
        &["`timeout` needs a unit, found `30`", "help: write `30s`"],
    );
    check(
        "  a: { tool: t, timeout: soon }\n",
        &["invalid duration `soon`"],
    );
    check(
        "  a: { tool: t, retry_policy: { max_retries: -1 } }\n",
        &["`max_retries` must be between 0 and 100, found -1"],
    );
    check(
        "  a: { tool: t, retry_policy: { max_retries: 1000000 } }\n",
        &["between 0 and 100"],
    );
    check(
        "  a: { tool: t, timeout: 2d }\n",
        &["longer than the limit"],
    );
}

#[test]
fn tool_kinds_and_required_fields() {
    let out = diags(
        "tools:\n  x: { kind: htp, url: http://a }\n  y: { kind: http }\nnodes:\n  a: { tool: x }\n",
    );
    assert!(out.contains("unknown tool kind `htp`"), "{out}");
    assert!(out.contains("help: did you mean `http`?"), "{out}");
    assert!(
        out.contains("tool `y` (kind http) is missing required key `url`"),
        "{out}"
    );
}

#[test]
fn every_problem_is_reported_in_file_order() {
    let out = diags(
        "nme: x\ntools:\n  t: { kind: function, function: core.echo }\nnodes:\n  a: { tool: u }\n  b: { tool: t, timeout: 5 }\n",
    );
    let lines: Vec<&str> = out.lines().filter(|l| l.contains("error:")).collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(lines[0].starts_with("w.yaml:1:1:"), "{out}");
    assert!(lines[1].starts_with("w.yaml:5:"), "{out}");
    assert!(lines[2].starts_with("w.yaml:6:"), "{out}");
}

#[test]
fn empty_and_non_mapping_files() {
    assert!(diags("").contains("the file is empty"));
    assert!(
        diags("   \n# only a comment\n").contains("the file is empty")
            || diags("   \n# only a comment\n").contains("must be a mapping")
    );
    assert!(diags("- a\n- b\n").contains("a workflow file must be a mapping"));
}

#[test]
fn input_declarations() {
    let out = diags(&format!(
        "inputs:\n  n: {{ type: integr }}\n  m: {{ type: string, default: 3 }}\n{TOOLS}nodes:\n  a: {{ tool: t }}\n"
    ));
    assert!(out.contains("unknown type `integr` for input `n`"), "{out}");
    assert!(out.contains("help: did you mean `integer`?"), "{out}");
    assert!(
        out.contains("the default of input `m` is not of type string"),
        "{out}"
    );
}

#[test]
fn non_utf8_is_refused_with_a_position() {
    let err = decode(b"name: a\nx: \xff\n").expect_err("not utf-8");
    assert_eq!(err.pos, Pos { line: 2, col: 4 });
}

/// The condition each spelling of `if:` parses to (`None`: refused).
fn condition_of(value: &str) -> Option<String> {
    let text = format!(
        "inputs:\n  go: {{ type: boolean }}\n{TOOLS}nodes:\n  a: {{ tool: t, if: {value} }}\n"
    );
    let wf = parse_str(&text, "w.yaml").ok()?;
    let cond = wf.nodes[0].condition.as_ref()?;
    assert!(cond.whole_expr().is_some(), "{value}: not one expression");
    cond.whole_expr().map(str::to_string)
}

#[test]
fn every_condition_is_one_expression() {
    assert_eq!(condition_of("false").as_deref(), Some("false"));
    assert_eq!(condition_of("true").as_deref(), Some("true"));
    assert_eq!(condition_of("\"false\"").as_deref(), Some("false"));
    assert_eq!(condition_of("inputs.go").as_deref(), Some("inputs.go"));
    assert_eq!(
        condition_of("\"${{ inputs.go }} \"").as_deref(),
        Some("inputs.go")
    );
    assert_eq!(
        condition_of("\"  ${{ not inputs.go }}\\n\"").as_deref(),
        Some("not inputs.go")
    );
    for refused in [
        "\"${{ inputs.go }} and ${{ inputs.go }}\"",
        "\"go ${{ inputs.go }}\"",
        "\"\"",
        "\"  \"",
        "1",
        "[true]",
        "\"yes\"",
        "\"inputs.go and\"",
    ] {
        assert_eq!(condition_of(refused), None, "{refused} must be refused");
    }
}

#[test]
fn conditions_evaluate_to_their_truth() {
    let ctx = serde_json::json!({"inputs": {"go": false}});
    for (value, want) in [
        ("false", false),
        ("\"false\"", false),
        ("\"${{ inputs.go }} \"", false),
        ("\"not inputs.go\"", true),
        ("true", true),
    ] {
        let text = format!(
            "inputs:\n  go: {{ type: boolean }}\n{TOOLS}nodes:\n  a: {{ tool: t, if: {value} }}\n"
        );
        let wf = parse_str(&text, "w.yaml").expect("valid");
        let cond = wf.nodes[0].condition.as_ref().expect("condition");
        assert_eq!(expr::eval_condition(cond, &ctx), Ok(want), "{value}");
    }
}

#[test]
fn refused_conditions_and_flags_say_where_and_why() {
    check(
        "  a: { tool: t, if: \"x ${{ run.id }}\" }\n",
        &["w.yaml:4:21: error: `if` must be one expression, found `x ${{ run.id }}`"],
    );
    check(
        "  a: { tool: t, if: 0 }\n",
        &["w.yaml:4:21: error: `if` must be true, false or an expression, found an integer"],
    );
    check(
        "  a: { tool: t, continue_on_error: \"false\" }\n",
        &[
            "w.yaml:4:36: error: `continue_on_error` must be true or false, found the string `false`",
        ],
    );
    check(
        "  a: { tool: \"${{ run.id }}\" }\n",
        &["w.yaml:4:14: error: `tool` does not take expressions"],
    );
}

#[test]
fn secrets_may_only_be_read_whole() {
    let text = |with: &str| {
        format!(
            "tools:\n  h: {{ kind: http, method: POST, url: \"http://127.0.0.1:9/\" }}\nnodes:\n  a: {{ tool: h, with: {{ v: \"{with}\" }} }}\n"
        )
    };
    for ok in [
        "${{ secrets.TOKEN }}",
        "Bearer ${{ secrets.TOKEN }}",
        "${{ secrets.A }}:${{ secrets.B }}",
        "${{ 'about secrets' }}",
    ] {
        assert_eq!(diags(&text(ok)), "", "{ok}");
    }
    for refused in [
        "${{ secrets.TOKEN | upper }}",
        "${{ secrets.TOKEN ~ 'x' }}",
        "${{ secrets.TOKEN[0:4] }}",
        "${{ secrets.TOKEN == 'x' }}",
        "${{ secrets.TOKEN | length }}",
        "${{ (secrets.TOKEN) }}",
    ] {
        assert!(
            diags(&text(refused)).contains("applies an operation to a secret"),
            "{refused}: {}",
            diags(&text(refused))
        );
    }
}
