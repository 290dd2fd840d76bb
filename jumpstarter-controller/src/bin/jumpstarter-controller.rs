//! `jumpstarter-controller`: the controller on one machine (embedded store, in-process router).
fn main() -> std::process::ExitCode {
    jumpstarter_controller::cli::main()
}
