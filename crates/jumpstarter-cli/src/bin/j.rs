//! `j`: drive the exporter of the current `jmp shell`.
fn main() -> std::process::ExitCode {
    jumpstarter_cli::j::main()
}
