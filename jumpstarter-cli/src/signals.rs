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

/// Resolves on SIGINT or SIGTERM: what stops a serving command.
pub async fn shutdown_signal() {
    first_of(&[libc::SIGINT, libc::SIGTERM]).await;
}

/// The signals that stop `jmp shell` at any stage (Ctrl-C, `timeout`/CI cancellation, a
/// closed terminal).
pub const STOP: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// Watches `signals` from now on (unlike [`first_of`], whose handlers exist only once it is
/// first polled): the returned future resolves with the first one delivered after this call.
/// Once watched, a signal no longer ends the process by itself: the caller must act on it.
pub fn watch(signals: &[libc::c_int]) -> impl Future<Output = libc::c_int> + Send + 'static {
    let mut watched = Vec::new();
    for &n in signals {
        match signal(SignalKind::from_raw(n)) {
            Ok(s) => watched.push((n, s)),
            Err(e) => tracing::debug!(
                "cannot watch signal {n}: {e}",
                e = jumpstarter_core::error_chain(&e)
            ),
        }
    }
    async move {
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
