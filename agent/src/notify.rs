//! systemd notifications (minimal; see docs/systemd.md).

use std::time::Duration;

pub fn ready() {}
pub fn status(_: &str) {}
pub fn stopping() {}
pub fn watchdog() {}
pub fn watchdog_interval() -> Option<Duration> {
    None
}
