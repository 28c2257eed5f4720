//! One spelling for taking a lock (the operator's too).

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Take `m` even when a thread panicked while holding it: every value floe keeps behind a
/// lock is a cache, a registry or a tally that stays valid after any single write, so a
/// poisoned lock must not take the process down with it.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// [`lock`] for readers of an `RwLock`.
pub fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

/// [`lock`] for a writer of an `RwLock`.
pub fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

/// A lock per key (a session's id): what must not race for one key takes its own, and other
/// keys go on meanwhile.
#[derive(Default)]
pub struct KeyedLocks {
    locks: Mutex<std::collections::HashMap<String, std::sync::Arc<Mutex<()>>>>,
}

impl KeyedLocks {
    /// `key`'s lock (made on first use; kept, as keys are few: a gateway's sessions).
    pub fn of(&self, key: &str) -> std::sync::Arc<Mutex<()>> {
        lock(&self.locks)
            .entry(key.to_string())
            .or_default()
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::{lock, KeyedLocks};

    #[test]
    fn a_key_s_lock_is_its_own_and_the_same_each_time() {
        let locks = KeyedLocks::default();
        let a = locks.of("a");
        let _held = lock(&a);
        // Another key's is free while `a`'s is held; `a`'s is the one held.
        assert!(locks.of("b").try_lock().is_ok());
        assert!(locks.of("a").try_lock().is_err());
    }
}
