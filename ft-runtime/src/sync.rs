//! The one place the shared-memory primitives come from: `std` normally, `loom`'s
//! models under `cfg(loom)`, so the loom tests explore every interleaving of the very
//! code that ships.

#[cfg(loom)]
pub(crate) use loom::sync::{Arc, Condvar, Mutex, MutexGuard};

#[cfg(not(loom))]
pub(crate) use std::sync::{Arc, Condvar, Mutex, MutexGuard};
