//! What the simulated-group tests share: their detector settings, how long they wait,
//! and the wait for a message.

use std::time::Duration;

use ft::{Event, Rank, Runtime, Settings};

/// The longest a test waits for an event.
pub const WAIT: Duration = Duration::from_secs(20);

/// A fast detector: 20 ms heartbeats, a 400 ms timeout.
pub fn settings() -> Settings {
    Settings {
        period: Duration::from_millis(20),
        timeout: Duration::from_millis(400),
        ..Settings::default()
    }
}

/// The next message event of `handle`, skipping the others.
#[allow(dead_code)] // not every test binary that includes this module takes messages
pub fn next_message(handle: &Runtime) -> (Rank, u64, Vec<u8>) {
    loop {
        match handle.next_event(Some(WAIT)).expect("the handle runs") {
            Some(Event::Message { from, tag, bytes }) => return (from, tag, bytes.to_vec()),
            Some(_) => continue,
            None => panic!("no message within {WAIT:?}"),
        }
    }
}
