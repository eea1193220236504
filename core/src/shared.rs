//! `SharedPool`: a [`Pool`] behind an `embassy-sync` blocking mutex, for edge agents whose tasks
//! (an allocator task, a status reporter) share one pool without a heap or an OS.

use core::cell::RefCell;

use embassy_sync::blocking_mutex::Mutex;
use embassy_sync::blocking_mutex::raw::RawMutex;

use crate::pool::Pool;

/// A [`Pool`] shared between tasks. `M` is the raw mutex: `CriticalSectionRawMutex` when tasks run
/// on different threads or interrupt levels, `NoopRawMutex` within one executor. Can be a `static`
/// (`SharedPool::new` is `const`).
pub struct SharedPool<M: RawMutex, S, const N: usize = 2> {
    inner: Mutex<M, RefCell<Pool<S, N>>>,
}

/// [`SharedPool::with`] was called again from inside its own closure (a re-entrant lock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct PoolBusy;

impl core::fmt::Display for PoolBusy {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("the shared pool is already borrowed by this task (re-entrant call)")
    }
}

impl core::error::Error for PoolBusy {}

impl<M: RawMutex, S, const N: usize> SharedPool<M, S, N> {
    /// Wraps a pool.
    pub const fn new(pool: Pool<S, N>) -> Self {
        SharedPool {
            inner: Mutex::new(RefCell::new(pool)),
        }
    }

    /// Runs `f` with exclusive access to the pool and returns its result.
    ///
    /// # Errors
    /// [`PoolBusy`] if called from inside another `with` on the same pool (instead of panicking,
    /// as a plain `RefCell` would).
    pub fn with<R>(&self, f: impl FnOnce(&mut Pool<S, N>) -> R) -> Result<R, PoolBusy> {
        self.inner.lock(|cell| match cell.try_borrow_mut() {
            Ok(mut pool) => Ok(f(&mut pool)),
            Err(_) => Err(PoolBusy),
        })
    }

    /// Gives the pool back.
    pub fn into_inner(self) -> Pool<S, N> {
        self.inner.into_inner().into_inner()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Cidr, CidrSet, storage_words_for};
    use embassy_sync::blocking_mutex::raw::NoopRawMutex;

    #[test]
    fn shared_pool_allocates_and_refuses_reentry() {
        let cluster = Cidr::parse("10.244.0.0/16").unwrap();
        let set = CidrSet::new(cluster, 24, [0u64; storage_words_for(16, 24)]).unwrap();
        let shared: SharedPool<NoopRawMutex, _> = SharedPool::new(Pool::new(set, None).unwrap());
        let first = shared.with(|pool| pool.allocate_node()).unwrap().unwrap();
        assert_eq!(first[0].cidr, Cidr::parse("10.244.0.0/24").unwrap());
        let nested = shared.with(|_| shared.with(|pool| pool.allocate_node()));
        assert_eq!(nested, Ok(Err(PoolBusy)));
        assert_eq!(shared.into_inner().sets()[0].allocated_count(), 1);
    }
}
