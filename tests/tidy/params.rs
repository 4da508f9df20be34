//! Parameters have names: a function does not take an anonymous tuple it destructures
//! (`(ledger, clock): (&Ledger, &Clock)`), which only hid a long parameter list from
//! clippy's count. Values that belong together are a struct with a name; the others are
//! parameters of their own. Bindings (`let`) and closures may still destructure.

use regex::Regex;

use super::{read, report, rust_sources};

/// The lines of `text` that declare a destructured tuple parameter, as `path:line`.
fn offenders(path: &str, text: &str) -> Vec<String> {
    // A parameter on its own line, or inside a one-line signature.
    let own_line = Regex::new(r"^\s*\(\s*[a-z_][a-z0-9_]*(\s*,\s*[a-z_][a-z0-9_]*)+\s*\)\s*:\s*\(")
        .expect("regex");
    let inline =
        Regex::new(r"\bfn\s+\w+(<[^>]*>)?\s*\([^)]*?\(\s*[a-z_][a-z0-9_]*(\s*,\s*[a-z_][a-z0-9_]*)+\s*\)\s*:\s*\(")
            .expect("regex");
    text.lines()
        .enumerate()
        .filter(|(_, l)| own_line.is_match(l) || inline.is_match(l))
        .map(|(i, _)| format!("{path}:{}", i + 1))
        .collect()
}

#[test]
fn no_parameter_is_an_anonymous_tuple() {
    // The rule can fail: both shapes of a tuple parameter are found; a binding, a
    // closure and a plain parameter are not.
    let planted = "fn a(\n    x: u8,\n    (ledger, clock): (&L, &C),\n) {}\n\
                   fn b((s, k): (&str, &str)) {}\n\
                   let (s, k): (&str, &str) = (\"\", \"\");\n\
                   let f = |(s, k): (&str, &str)| s;\n\
                   fn c(pair: (u8, u8)) {}\n";
    assert_eq!(offenders("p.rs", planted), ["p.rs:3", "p.rs:5"]);
    let found: Vec<String> = rust_sources()
        .iter()
        // This file plants offenders of its own, above.
        .filter(|p| !p.ends_with("tidy/params.rs"))
        .flat_map(|p| offenders(&p.to_string_lossy(), &read(p)))
        .collect();
    report("anonymous tuple parameters", &found);
}
