//! A closed stdout (`jmp get exporters | head -1`) ends the tools quietly, as a closed pipe
//! ends most Unix tools: no panic message, no backtrace, exit code 141 (128 + SIGPIPE, what
//! a shell reports for a tool the signal killed).

/// The exit code after a write to a closed pipe.
pub const BROKEN_PIPE_EXIT_CODE: i32 = 141;

/// Whether a panic message is the standard library's for a write to a closed stdout
/// (`failed printing to stdout: Broken pipe (os error 32)`).
fn is_broken_pipe(message: &str) -> bool {
    message.contains("Broken pipe") || message.contains("os error 32")
}

/// Installs a panic hook that turns `println!`'s panic on a closed stdout into a quiet exit
/// with [`BROKEN_PIPE_EXIT_CODE`]; every other panic is reported as before.
pub fn exit_quietly_on_closed_stdout() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if is_broken_pipe(message) {
            std::process::exit(BROKEN_PIPE_EXIT_CODE);
        }
        report(info);
    }));
}

/// Writes `bytes` to stdout; a closed stdout ends the process quietly (see the module).
pub fn write_stdout(bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            std::process::exit(BROKEN_PIPE_EXIT_CODE)
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_standard_librarys_message_for_a_closed_stdout_is_recognised() {
        assert!(is_broken_pipe(
            "failed printing to stdout: Broken pipe (os error 32)"
        ));
        assert!(!is_broken_pipe("index out of bounds"));
    }
}
