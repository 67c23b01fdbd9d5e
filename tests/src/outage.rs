//! A network outage in the middle of a download, as the tests of both
//! server kinds (a static manifest server, a DDI server) check it: the job
//! waits it out — the same job, its status saying it waits for the network,
//! no install failure — and fetches the artifact once, at most one frame
//! twice (the one in flight when the network went).

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::device::Device;

/// Wait until `dev` has logged `n` failed attempts of one outage
/// (`… failing since …`).
pub fn wait_failed_attempts(dev: &Device, n: usize, timeout: Duration) {
    let t = Instant::now();
    loop {
        let attempts = dev.log().matches("failing since").count();
        if attempts >= n {
            return;
        }
        assert!(
            t.elapsed() < timeout,
            "{attempts} failed attempt(s) only within {timeout:?}:\n{}",
            dev.log_tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The job of `during` (a status taken before the outage) goes on, no
/// install has ended, and the status says since when the network is
/// waited for.
pub fn assert_waiting_for_network(dev: &Device, during: &Value) {
    // A poll may be under way: the state may read "checking".
    let st = dev.status();
    assert_eq!(st["job"]["id"], during["job"]["id"], "{st:#}");
    assert!(st["last_install"].is_null(), "{st:#}");
    assert!(
        st["last_error"]
            .as_str()
            .is_some_and(|e| e.starts_with("waiting for the network since")),
        "{st:#}"
    );
}

/// What crossed the network for the job of `st`, as the device counts the
/// body bytes it received: the artifact `payload` signs once, and at most
/// one of its frames twice.
pub fn assert_at_most_one_frame_twice(st: &Value, payload: &Value) {
    let max_frame = payload["artifact"]["frames"]
        .as_array()
        .expect("the payload's frames")
        .iter()
        .filter_map(|f| f["size"].as_u64())
        .max()
        .unwrap_or(0);
    let size = payload["artifact"]["size"]
        .as_u64()
        .expect("the artifact's size");
    let received = st["job"]["bytes_downloaded"].as_u64().unwrap_or(u64::MAX);
    assert!(
        received <= size + max_frame,
        "{received} bytes of a {size}-byte artifact received (frames up to {max_frame} bytes)"
    );
}
