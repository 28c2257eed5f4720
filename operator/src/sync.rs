//! One spelling for taking a lock.

use std::sync::{Mutex, MutexGuard};

/// Take `m` even when a thread panicked while holding it: every value the operator keeps
/// behind a lock is a cache or a tally that stays valid after any single write, so a poisoned
/// lock must not take the controllers down with it.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
