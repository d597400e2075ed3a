//! What the simulated-group tests share: their detector settings and how long they wait.

use std::time::Duration;

use ft::Settings;

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
