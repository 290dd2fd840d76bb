//! Counts the reconcile loop's passes, so that `CreateLease` can answer once a pass has
//! looked at the new lease: a lease granted at once then comes back ready, and a client of
//! ours needs no `GetLease` poll to learn of its grant.
//!
//! A pass that started before the lease was stored may have missed it; the first pass that
//! starts after it has not. [`ReconcilePasses::after_now`] names that pass and
//! [`ReconcilePasses::wait_done`] waits (bounded) for it to end.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use tokio::sync::watch;

/// How long `CreateLease` waits for the pass that schedules its lease before it answers
/// with the lease as stored (waiting; the client then polls, as upstream's does anyway).
pub const GRANT_WAIT: Duration = Duration::from_secs(1);

/// The reconcile loop's pass counters.
pub struct ReconcilePasses {
    started: AtomicU64,
    done: watch::Sender<u64>,
}

impl Default for ReconcilePasses {
    fn default() -> Self {
        Self {
            started: AtomicU64::new(0),
            done: watch::channel(0).0,
        }
    }
}

impl ReconcilePasses {
    /// A pass begins (called by the loop before it reads the objects).
    pub fn begin(&self) {
        self.started.fetch_add(1, Ordering::SeqCst);
    }

    /// The pass that began last has ended, whatever its outcome.
    pub fn end(&self) {
        let started = self.started.load(Ordering::SeqCst);
        self.done.send_replace(started);
    }

    /// The number of the first pass that begins after now: it sees whatever was stored
    /// before this call.
    pub fn after_now(&self) -> u64 {
        self.started.load(Ordering::SeqCst) + 1
    }

    /// Waits until pass `pass` has ended, at most `limit`; whether it did.
    pub async fn wait_done(&self, pass: u64, limit: Duration) -> bool {
        let mut done = self.done.subscribe();
        tokio::time::timeout(limit, done.wait_for(|&d| d >= pass))
            .await
            .is_ok_and(|r| r.is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn waits_for_the_first_pass_that_began_after_the_call() {
        let passes = std::sync::Arc::new(ReconcilePasses::default());
        passes.begin();
        // A pass is running: the one after it is the first to see what is stored now.
        let wanted = passes.after_now();
        assert_eq!(wanted, 2);
        passes.end();
        assert!(
            !passes.wait_done(wanted, Duration::from_millis(20)).await,
            "the pass that was running when the lease was stored does not count"
        );
        let p = passes.clone();
        let waiter =
            tokio::spawn(async move { p.wait_done(wanted, Duration::from_secs(60)).await });
        passes.begin();
        passes.end();
        assert!(waiter.await.unwrap());
    }

    #[tokio::test]
    async fn a_loop_that_does_not_run_lets_the_wait_end_at_its_limit() {
        let passes = ReconcilePasses::default();
        let wanted = passes.after_now();
        assert!(!passes.wait_done(wanted, Duration::from_millis(10)).await);
    }
}
