//! How much a process does while it should be asleep: context switches of
//! all its threads and the CPU time it used, read from `/proc`.
//!
//! Voluntary switches count the times a thread went to sleep (a wake-up
//! each); involuntary ones catch a thread that spins without sleeping (a
//! zero timeout), and the CPU time catches what both would miss.

use std::time::{Duration, Instant};

/// What a process did over one measured interval.
#[derive(Debug, Clone, Copy)]
pub struct Activity {
    /// Context switches (voluntary + involuntary), summed over threads.
    pub switches: u64,
    /// User + system CPU time.
    pub cpu: Duration,
    pub over: Duration,
}

impl Activity {
    pub fn wakeups_per_sec(&self) -> f64 {
        self.switches as f64 / self.over.as_secs_f64()
    }

    pub fn cpu_percent(&self) -> f64 {
        100.0 * self.cpu.as_secs_f64() / self.over.as_secs_f64()
    }
}

/// Watch `pid` for `over`.
pub fn measure(pid: u32, over: Duration) -> Activity {
    let (s0, c0) = (switches(pid), cpu(pid));
    let t = Instant::now();
    std::thread::sleep(over);
    let (s1, c1) = (switches(pid), cpu(pid));
    Activity {
        switches: s1.saturating_sub(s0),
        cpu: c1.saturating_sub(c0),
        over: t.elapsed(),
    }
}

/// Context switches of every thread of `pid` so far.
fn switches(pid: u32) -> u64 {
    let dir = format!("/proc/{pid}/task");
    let mut total = 0;
    for task in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("reading {dir}: {e}")) {
        let Ok(task) = task else { continue };
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue; // the thread ended meanwhile
        };
        for line in status.lines() {
            if let Some(v) = line
                .strip_prefix("voluntary_ctxt_switches:")
                .or_else(|| line.strip_prefix("nonvoluntary_ctxt_switches:"))
            {
                total += v.trim().parse::<u64>().unwrap_or(0);
            }
        }
    }
    total
}

/// utime + stime of `pid` (all threads) so far.
fn cpu(pid: u32) -> Duration {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    // The command name may contain spaces; fields resume after its ')'.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3, utime 14 and stime 15 (1-based).
    let ticks = |i: usize| {
        fields
            .get(i - 3)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let t = ticks(14) + ticks(15);
    Duration::from_millis(t * 1000 / hz)
}
