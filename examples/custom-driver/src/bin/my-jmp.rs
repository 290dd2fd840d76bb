//! The lab's `jmp`: every command and flag of `jmp`, serving the stock drivers and the
//! lab's `Chamber`.
fn main() -> std::process::ExitCode {
    jumpstarter_cli::jmp_main_with(jumpstarter_example_custom_driver::toolkit())
}
