//! `jmp`: the Jumpstarter CLI.
fn main() -> std::process::ExitCode {
    jumpstarter_cli::jmp::main()
}
