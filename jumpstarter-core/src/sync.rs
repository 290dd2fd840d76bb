//! Locking that survives a panic elsewhere.

use std::sync::{Mutex, MutexGuard};

/// [`Mutex::lock`] that tolerates poisoning.
///
/// Our mutexes guard maps and counters that every critical section leaves consistent (no
/// invariant spans a panic point), so a panic in one task holding the lock must not take down
/// every later user: the guard is recovered from the poison error.
pub trait LockExt<T: ?Sized> {
    /// Locks, recovering the guard if a previous holder panicked.
    fn lock_or_recover(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> LockExt<T> for Mutex<T> {
    fn lock_or_recover(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_still_locks() {
        let m = std::sync::Arc::new(Mutex::new(1));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = m2.lock().unwrap();
            panic!("poison it");
        })
        .join();
        assert!(m.is_poisoned());
        *m.lock_or_recover() += 1;
        assert_eq!(*m.lock_or_recover(), 2);
    }
}
