//! `jumpstarter-router`: the standalone router binary.
fn main() -> std::process::ExitCode {
    jumpstarter_router::cli::main()
}
