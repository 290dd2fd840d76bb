//! Counts the reconcile loop's passes, so that `CreateLease` can answer once a pass has
//! looked at the new lease: a lease granted at once then comes back ready, and a client of
//! ours needs no `GetLease` poll to learn of its grant.
//!
//! A pass that started before the lease was stored may have missed it; the first pass that
//! starts after it has not. [`ReconcilePasses::after_now`] names that pass and
//! [`ReconcilePasses::wait_done`] waits (bounded) for it to end. A pass also hands over the
//! leases it wrote, as stored ([`ReconcilePasses::wrote`]): `CreateLease` answers with its
//! lease from there instead of reading it back (1,000 reads on the store's reader threads
//! when 1,000 leases are asked at once, beside the grants being delivered).

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::sync::watch;

use crate::objects::{Lease, ObjectKey};

/// How long `CreateLease` waits for the pass that schedules its lease before it answers
/// with the lease as stored (waiting; the client then polls, as upstream's does anyway).
pub const GRANT_WAIT: Duration = Duration::from_secs(1);

/// The leases one pass wrote, by key, as the store answered each write.
pub type WrittenLeases = HashMap<ObjectKey, Lease>;

/// The last pass that ended.
#[derive(Clone, Default)]
struct Ended {
    /// Its number.
    pass: u64,
    /// The leases it wrote (kept until the next pass ends).
    written: Arc<WrittenLeases>,
}

/// The reconcile loop's pass counters.
pub struct ReconcilePasses {
    started: AtomicU64,
    /// What the running pass wrote, handed over before it ends.
    wrote: Mutex<Arc<WrittenLeases>>,
    done: watch::Sender<Ended>,
}

impl Default for ReconcilePasses {
    fn default() -> Self {
        Self {
            started: AtomicU64::new(0),
            wrote: Mutex::default(),
            done: watch::channel(Ended::default()).0,
        }
    }
}

impl ReconcilePasses {
    /// A pass begins (called by the loop before it reads the objects).
    pub fn begin(&self) {
        self.started.fetch_add(1, Ordering::SeqCst);
    }

    /// The running pass wrote `leases` (as stored); published when it ends.
    pub fn wrote(&self, leases: WrittenLeases) {
        use jumpstarter_core::sync::LockExt;
        *self.wrote.lock_or_recover() = Arc::new(leases);
    }

    /// The pass that began last has ended, whatever its outcome.
    pub fn end(&self) {
        use jumpstarter_core::sync::LockExt;
        let started = self.started.load(Ordering::SeqCst);
        let written = std::mem::take(&mut *self.wrote.lock_or_recover());
        self.done.send_replace(Ended {
            pass: started,
            written,
        });
    }

    /// The number of the first pass that begins after now: it sees whatever was stored
    /// before this call.
    pub fn after_now(&self) -> u64 {
        self.started.load(Ordering::SeqCst) + 1
    }

    /// Waits until pass `pass` has ended, at most `limit`; whether it did.
    pub async fn wait_done(&self, pass: u64, limit: Duration) -> bool {
        self.wait_written(pass, limit).await.is_some()
    }

    /// Waits until pass `pass` has ended, at most `limit`; then the leases written by the
    /// last pass that ended (`pass` or a later one): a lease found there is as the store
    /// holds it at least as late as the end of `pass`. `None` when `pass` did not end in time.
    pub async fn wait_written(&self, pass: u64, limit: Duration) -> Option<Arc<WrittenLeases>> {
        let mut done = self.done.subscribe();
        match tokio::time::timeout(limit, done.wait_for(|d| d.pass >= pass)).await {
            Ok(Ok(ended)) => Some(ended.written.clone()),
            _ => None,
        }
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
    async fn a_wait_gets_the_leases_written_by_the_last_pass_that_ended() {
        let passes = ReconcilePasses::default();
        let lease = |name: &str| {
            let mut l = Lease::default();
            l.metadata.namespace = Some("default".into());
            l.metadata.name = Some(name.into());
            l
        };
        let key = |name: &str| ("default".to_string(), name.to_string());
        let wanted = passes.after_now();
        passes.begin();
        passes.wrote(WrittenLeases::from([(key("a"), lease("a"))]));
        passes.end();
        let written = passes
            .wait_written(wanted, Duration::from_millis(20))
            .await
            .unwrap();
        assert!(written.contains_key(&key("a")));
        // A pass that wrote nothing hands over nothing: the first pass's leases are not
        // kept for it.
        passes.begin();
        passes.end();
        let written = passes
            .wait_written(wanted, Duration::from_millis(20))
            .await
            .unwrap();
        assert!(written.is_empty());
        // Not yet ended: nothing.
        let later = passes.after_now();
        passes.begin();
        passes.wrote(WrittenLeases::from([(key("b"), lease("b"))]));
        assert!(
            passes
                .wait_written(later, Duration::from_millis(10))
                .await
                .is_none()
        );
        passes.end();
        assert!(
            passes
                .wait_written(later, Duration::from_millis(10))
                .await
                .unwrap()
                .contains_key(&key("b"))
        );
    }

    #[tokio::test]
    async fn a_loop_that_does_not_run_lets_the_wait_end_at_its_limit() {
        let passes = ReconcilePasses::default();
        let wanted = passes.after_now();
        assert!(!passes.wait_done(wanted, Duration::from_millis(10)).await);
    }
}
