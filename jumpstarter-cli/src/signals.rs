//! Waiting for the signals that stop our commands.

use futures::future::select_all;
use tokio::signal::unix::{SignalKind, signal};

/// Resolves with the number of the first of `signals` delivered; never, if none of them
/// can be watched.
pub async fn first_of(signals: &[libc::c_int]) -> libc::c_int {
    let mut watched = Vec::new();
    for &n in signals {
        if let Ok(s) = signal(SignalKind::from_raw(n)) {
            watched.push((n, s));
        }
    }
    if watched.is_empty() {
        return std::future::pending().await;
    }
    let waits = watched.iter_mut().map(|(n, s)| {
        Box::pin(async move {
            s.recv().await;
            *n
        })
    });
    select_all(waits).await.0
}

/// Resolves on SIGINT or SIGTERM: what stops `jmp run` and `jmp mcp serve`.
pub async fn shutdown_signal() {
    first_of(&[libc::SIGINT, libc::SIGTERM]).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reports_which_signal_came() {
        let wait = tokio::spawn(first_of(&[libc::SIGUSR1, libc::SIGUSR2]));
        // Give the task time to install its handlers.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        nix_kill(libc::SIGUSR2);
        let got = tokio::time::timeout(std::time::Duration::from_secs(10), wait)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got, libc::SIGUSR2);
    }

    fn nix_kill(sig: libc::c_int) {
        let status = std::process::Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(std::process::id().to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }
}
