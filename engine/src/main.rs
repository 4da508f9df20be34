//! The `flow` binary: everything lives in the library so tests can call it.

fn main() -> std::process::ExitCode {
    flow::cli::main()
}
