//! Whether flow colours what it prints (today: clap's help and usage errors; log lines
//! and progress are never coloured).
//!
//! The choice follows the conventions people set once in their shell: `--color` (or
//! `FLOW_COLOR`) when given, else `NO_COLOR` (any non-empty value: never), else
//! `CLICOLOR_FORCE` (non-empty and not `0`: always), else colour only when the stream
//! is a terminal — so `flow --help | less` and log files get plain text.

use std::ffi::OsString;
use std::io::IsTerminal;

/// `--color`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ColorWhen {
    /// Colour when the stream is a terminal, unless `NO_COLOR` / `CLICOLOR_FORCE` say
    /// otherwise.
    Auto,
    /// Always colour.
    Always,
    /// Never colour.
    Never,
}

/// What the environment says, read once (a pure function of it, for tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Env {
    /// `NO_COLOR` set to something non-empty.
    pub no_color: bool,
    /// `CLICOLOR_FORCE` set to something other than empty or `0`.
    pub force: bool,
}

impl Env {
    /// The process environment.
    pub fn current() -> Self {
        let set = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        Self {
            no_color: set("NO_COLOR").is_some(),
            force: set("CLICOLOR_FORCE").is_some_and(|v| v != "0"),
        }
    }
}

/// The decision, given the flag, the environment and whether the stream is a terminal.
pub fn colored(when: ColorWhen, env: Env, terminal: bool) -> bool {
    match when {
        ColorWhen::Always => true,
        ColorWhen::Never => false,
        ColorWhen::Auto if env.no_color => false,
        ColorWhen::Auto if env.force => true,
        ColorWhen::Auto => terminal,
    }
}

/// `--color` as spelled in raw arguments (or `FLOW_COLOR`), for output printed before
/// (or instead of) a successful parse: help, version and usage errors. An unreadable
/// value counts as `auto`; the parser reports it.
pub fn requested(args: &[OsString]) -> ColorWhen {
    let mut value = std::env::var("FLOW_COLOR").ok();
    let mut it = args.iter().skip(1);
    while let Some(arg) = it.next() {
        let arg = arg.to_string_lossy();
        if arg == "--" {
            break;
        }
        if let Some(v) = arg.strip_prefix("--color=") {
            value = Some(v.to_string());
        } else if arg == "--color" {
            value = it.next().map(|v| v.to_string_lossy().into_owned());
        }
    }
    match value.as_deref() {
        Some("always") => ColorWhen::Always,
        Some("never") => ColorWhen::Never,
        _ => ColorWhen::Auto,
    }
}

/// Whether output to stdout (`to_stderr` false) or stderr should be coloured now.
pub fn for_stream(when: ColorWhen, to_stderr: bool) -> bool {
    let terminal = if to_stderr {
        std::io::stderr().is_terminal()
    } else {
        std::io::stdout().is_terminal()
    };
    colored(when, Env::current(), terminal)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule() {
        let env = |no_color, force| Env { no_color, force };
        for terminal in [false, true] {
            for (no_color, force) in [(false, false), (true, false), (false, true), (true, true)] {
                let e = env(no_color, force);
                assert!(colored(ColorWhen::Always, e, terminal));
                assert!(!colored(ColorWhen::Never, e, terminal));
                let auto = colored(ColorWhen::Auto, e, terminal);
                let want = !no_color && (force || terminal);
                assert_eq!(
                    auto, want,
                    "no_color={no_color} force={force} tty={terminal}"
                );
            }
        }
    }

    #[test]
    fn the_flag_is_read_from_raw_arguments() {
        let args = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(
            requested(&args(&["flow", "--color", "always", "runs"])),
            ColorWhen::Always
        );
        assert_eq!(
            requested(&args(&["flow", "runs", "--color=never"])),
            ColorWhen::Never
        );
        assert_eq!(
            requested(&args(&["flow", "--", "--color=never"])),
            ColorWhen::Auto
        );
    }
}
