//! `j`: drive the exporter of the current `jmp shell`, with commands built from its tree.

use std::process::ExitCode;

use jumpstarter_core::client::{
    ClientError, ConnectOptions,
    direct::{DIRECT_ENV, connect_session},
};

/// Entry point of the `j` binary: the stock drivers' commands.
pub fn main() -> ExitCode {
    main_with(crate::Toolkit::stock())
}

/// Entry point of a lab's own `j`: the commands of `toolkit`'s command table (for driver
/// classes it lacks, the generic `call`/`stream-call`), and everything else as `j`.
pub fn main_with(toolkit: crate::Toolkit) -> ExitCode {
    let commands = std::sync::Arc::clone(toolkit.commands());
    crate::pipe::exit_quietly_on_closed_stdout();
    jumpstarter_core::tls::install_tls_provider();
    let Some(host) = std::env::var("JUMPSTARTER_HOST")
        .ok()
        .filter(|h| !h.is_empty())
    else {
        eprintln!("Error: the j command must be used inside a jmp shell: JUMPSTARTER_HOST not set");
        return ExitCode::FAILURE;
    };
    let level = std::env::args().skip_while(|a| a != "--log-level").nth(1);
    crate::logging::init(level.as_deref(), false);
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("Error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = rt.block_on(async move {
        // Over the shell's direct path when it has one: its socket would relay every byte.
        let direct = std::env::var_os(DIRECT_ENV).map(std::path::PathBuf::from);
        let opts = ConnectOptions::from_env();
        let session = match connect_session(direct.as_deref(), &host, &opts).await {
            Ok(s) => s,
            Err(e) => {
                eprintln!("Error: {}", describe(&e));
                return ExitCode::FAILURE;
            }
        };
        let matches = match jumpstarter_drivers::j_command_with(&session, &commands).await.try_get_matches() {
            Ok(m) => m,
            Err(e) => {
                let _ = e.print();
                return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
            }
        };
        // Interrupted, the command is dropped before exiting, so that what it was writing
        // (a download's partial file) is removed rather than left behind.
        tokio::select! {
            r = jumpstarter_drivers::run_j_command_with(session.root(), matches, commands) => match r {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("Error: {}", jumpstarter_core::error_chain(&e));
                    ExitCode::FAILURE
                }
            },
            sig = crate::signals::first_of(&[libc::SIGINT, libc::SIGTERM, libc::SIGHUP]) => {
                eprintln!("\nInterrupted");
                ExitCode::from(u8::try_from(128 + sig).unwrap_or(1))
            }
        }
    });
    // A blocking thread still at work (a read stuck on a FIFO when interrupted, say) must not
    // keep j alive: give such threads a moment, then exit.
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    code
}

/// A client error for a person: an RPC's failure as `RPC: MESSAGE (gRPC code CODE)` (the
/// code as gRPC names it: `UNAVAILABLE`), not the status's debug dump.
pub fn describe(e: &ClientError) -> String {
    match e {
        ClientError::Rpc { rpc, status } => {
            let message = match status.message() {
                "" => "(no message)",
                m => m,
            };
            format!("{rpc}: {message} (gRPC code {})", code_name(status.code()))
        }
        other => jumpstarter_core::error_chain(other),
    }
}

/// `Unavailable` → `UNAVAILABLE`, `FailedPrecondition` → `FAILED_PRECONDITION`.
fn code_name(code: tonic::Code) -> String {
    let mut name = String::new();
    for (i, c) in format!("{code:?}").chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            name.push('_');
        }
        name.push(c.to_ascii_uppercase());
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rpc_errors_name_the_grpc_code_as_grpc_does() {
        let e = ClientError::Rpc {
            rpc: "GetReport",
            status: Box::new(tonic::Status::unavailable("the lease ended")),
        };
        assert_eq!(
            describe(&e),
            "GetReport: the lease ended (gRPC code UNAVAILABLE)"
        );
        assert_eq!(
            code_name(tonic::Code::FailedPrecondition),
            "FAILED_PRECONDITION"
        );
        assert_eq!(code_name(tonic::Code::Ok), "OK");
    }
}
