//! The lab's `j`: the stock commands plus `my-j CHAMBER target|read|ask|info`.
fn main() -> std::process::ExitCode {
    jumpstarter_cli::j_main_with(jumpstarter_example_custom_driver::toolkit())
}
