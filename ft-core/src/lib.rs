//! `ft-core`: the sans-IO heart of the fault-tolerance library.
//!
//! It keeps, per communicator, what each rank knows about failures (`L_i`, the local
//! view) and what all survivors agreed on (`G`, the global view), detects failures with
//! a heartbeat ring, agrees on `G` with a fault-tolerant collective, and encodes every
//! protocol frame with one codec.
//!
//! The crate does no I/O, reads no clock and uses no OS randomness: time is passed in as
//! [`time::Instant`], bytes go in through `handle_message` and come out through
//! `poll_transmit` into buffers the caller owns (see [`machine`]). It is `#![no_std]`
//! with `alloc`; the `std` feature only adds conversions and `std::error::Error` impls.
//!
//! Invariant kept by every type here, at every rank `i`: `G ⊆ L_i ⊆ F`, where `F` is the
//! set of ranks that really failed or were declared failed (fail-stop is enforced: a
//! rank declared failed stops itself).
//!
//! No `unsafe` code, but in one module: [`landing`], the buffer that transports receive
//! bulk data into in place (an allocation, a raw pointer to write through, slices over
//! what was written), with its invariants stated there.
#![no_std]
#![deny(unsafe_code)]

extern crate alloc;
#[cfg(any(test, feature = "std"))]
extern crate std;

pub mod agreement;
pub mod detector;
pub mod error;
pub mod landing;
pub mod machine;
pub mod messages;
pub mod node;
pub mod rank;
pub mod rankset;
pub mod rebuild;
pub mod rng;
pub mod shrink;
pub mod time;
pub mod tree;
pub mod view;
pub mod wire;

pub use error::{BufferTooShort, FrameError, ViewError};
pub use landing::{Filled, Landing, Slot};
pub use machine::{
    slice_of_frame, Bytes, HeldHead, HeldHeads, Promise, Protocol, Transmit, TransmitParts,
};
pub use messages::{Message, MessageStats, Messenger, MessengerConfig, SendError};
pub use rank::{Modifier, Rank, RankInfo, RankState, Scope, StateMask};
pub use rankset::{Members, RankSet};
pub use rng::SplitMix;
pub use time::{Duration, Instant};
pub use view::{Counts, FailureView};
