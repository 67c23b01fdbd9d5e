//! `cargo xtask bench soak [--polls N] [--cycles N] [--samples N]`: one
//! daemon through many idle polls and many update cycles in accelerated
//! time, with what it holds sampled along the way, so that a slow leak —
//! memory, descriptors, database pages, outbox rows, history — shows as a
//! curve that rises instead of staying flat.
//!
//! A simulated device (the test-support [`Device`]: slot files, the `file`
//! bootloader, the release `updraft` binary) polls a real nginx over TLS on
//! loopback and reports to a collector behind it. Time is accelerated, not
//! faked: a poll is asked for over the control socket (`check`, the request
//! `updraft check` sends) as soon as the previous one has been answered,
//! rather than after `server.poll_interval` (at least a second); the daemon's
//! own timer is an hour, so every poll is one of these. Each is the daemon's
//! whole poll: a conditional GET of the manifest on the kept-alive TLS
//! connection, answered `304`.
//!
//! * **Idle** (`--polls`, default 100,000): one daemon, the manifest
//!   unchanged. Sampled `--samples` times: the daemon's `VmRSS` and
//!   `VmHWM`, its open descriptors (`/proc/PID/fd`), the database file's
//!   size, the outbox rows and the history entries (`status` and `history`
//!   over the socket; `history` lists the last 200 of the 1,000 kept).
//! * **Cycles** (`--cycles`, default 500): a release published (two images
//!   taking turns, a new version and serial each time), `check`, the
//!   download into the other slot, the reboot the daemon asks for (the test
//!   support's: the daemon stopped, the boot selection followed, a new boot
//!   id), a new daemon that commits. Sampled after the commit: the same
//!   figures for the daemon of that boot, and the peak (`VmHWM`) of the
//!   daemon that installed.
//!
//! The figures are printed, never asserted: for each curve its value at
//! the first sample, after a tenth of the run, at half of it and at the end,
//! and the change over the second half. Every process started here (nginx,
//! the daemons) is stopped by its PID.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use updraft_tests::ca::TestCa;
use updraft_tests::collector::Collector;
use updraft_tests::device::{Device, DeviceSpec};
use updraft_tests::nginx::Nginx;
use updraft_tests::publisher::{Repo, image, keygen};
use updraft_tests::tmp::TempDir;

use super::common::{self, print_table};
use crate::util::Result;

const USAGE: &str = "usage: cargo xtask bench soak [--polls N] [--cycles N] [--samples N]";

/// Size of the slots and of the two release images.
const IMAGE: usize = 1024 * 1024;

const WAIT: Duration = Duration::from_secs(120);

pub fn run(args: &[String]) -> Result {
    let f = common::flags(args, &["polls", "cycles", "samples"])
        .map_err(|e| format!("{e}\n{USAGE}"))?;
    let polls = common::number_flag(&f, "polls", 100_000)?;
    let cycles = common::number_flag(&f, "cycles", 500)?;
    let samples = common::number_flag(&f, "samples", 20)?.max(2);
    common::require_tools(&["/usr/sbin/nginx"])
        .or_else(|_| common::require_tools(&["nginx"]))
        .map_err(|_| "nginx is not installed (apt-get install nginx)".to_string())?;
    let started = Instant::now();
    let tmp = TempDir::new("bench-soak");
    let bins = common::release_binaries()?;
    // SAFETY: no other thread exists yet (nginx and the collector start
    // theirs below), so nothing reads the environment while it changes.
    unsafe {
        std::env::set_var("UPDRAFT_BIN_DIR", &bins);
        std::env::remove_var("UPDRAFT_TEST_RUNNER");
    }

    let key = keygen(tmp.path(), "release");
    let repo = Repo::new(tmp.join("releases"));
    let images = [tmp.join("even.img"), tmp.join("odd.img")];
    for (seed, img) in (200..).zip(&images) {
        image(img, IMAGE, seed);
    }
    repo.release(&[&key], "1.0.0", &images[0], &[]);
    let ca = TestCa::new("updraft bench CA").map_err(|e| format!("making a CA: {e}"))?;
    let collector = Collector::start().map_err(|e| format!("starting a collector: {e}"))?;
    let nginx = Nginx::builder(&repo.dir)
        .ca(&ca)
        .report_to("/report", collector.addr())
        .start()
        .map_err(|e| format!("starting nginx: {e}"))?;
    let base = format!("https://{}", nginx.addr());
    let mut spec = DeviceSpec::simple(&key);
    spec.slot_size = IMAGE as u64;
    spec.server = format!(
        "manifest_url = {:?}\nreport_url = {:?}\nca_file = {:?}\nsystem_roots = false\n\
         poll_interval = \"1h\"\npoll_jitter = \"0s\"\nretry_max = \"5s\"\n",
        format!("{base}/manifest.json"),
        format!("{base}/report"),
        nginx.ca_file()
    );
    let mut dev = Device::new("bench-soak", spec);
    dev.init();
    dev.start_daemon();
    ask(&dev.socket, "check")?;
    settle(&mut dev, "1.0.0")?;

    println!("\n== idle: {polls} polls asked for back to back over the control socket");
    let every = (polls / samples).max(1);
    let mut idle = Vec::new();
    let t = Instant::now();
    idle.push(sample(&dev, 0, t)?);
    for n in 1..=polls {
        let reply = ask(&dev.socket, "check")?;
        if reply["ok"] != Value::Bool(true) {
            return Err(format!("poll {n}: the daemon answered {reply}"));
        }
        if n % every == 0 || n == polls {
            let s = sample(&dev, n, t)?;
            println!("  {}", s.line("polls"));
            idle.push(s);
        }
    }
    let idle_secs = t.elapsed().as_secs_f64();

    println!("\n== cycles: {cycles} releases installed, rebooted into and committed");
    let every = (cycles / samples).max(1);
    let mut cycle_samples = Vec::new();
    let t = Instant::now();
    cycle_samples.push(sample(&dev, 0, t)?);
    for n in 1..=cycles {
        let version = format!("1.{n}.0");
        repo.release(&[&key], &version, &images[(n % 2) as usize], &[]);
        ask(&dev.socket, "check")?;
        dev.wait_reboot_requested(WAIT);
        let installer = dev.daemon_pid().map(proc_kib).transpose()?;
        settle(&mut dev, &version)?;
        if n % every == 0 || n == cycles {
            let mut s = sample(&dev, n, t)?;
            s.install_hwm = installer.map(|m| m.1);
            println!("  {}", s.line("cycles"));
            cycle_samples.push(s);
        }
    }
    let cycle_secs = t.elapsed().as_secs_f64();
    dev.stop_daemon();

    println!(
        "\n== bench soak: {polls} idle polls in {idle_secs:.0} s ({:.1} ms each), \
         {cycles} update cycles in {cycle_secs:.0} s ({:.2} s each)",
        idle_secs * 1000.0 / polls.max(1) as f64,
        cycle_secs / cycles.max(1) as f64
    );
    print_curves("idle polls", &idle);
    print_curves("update cycles", &cycle_samples);
    let reports = collector.reports().len();
    println!(
        "\nreports the collector received: {reports}; the run took {:.0} s in all",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// One line request over the control socket (`{"cmd": …}`), its reply.
fn ask(socket: &Path, cmd: &str) -> Result<Value> {
    let mut s = UnixStream::connect(socket)
        .map_err(|e| format!("connecting to {}: {e}", socket.display()))?;
    s.set_read_timeout(Some(WAIT))
        .map_err(|e| format!("socket timeout: {e}"))?;
    writeln!(s, "{{\"cmd\":{cmd:?}}}").map_err(|e| format!("sending {cmd}: {e}"))?;
    let mut line = String::new();
    BufReader::new(s)
        .read_line(&mut line)
        .map_err(|e| format!("reading the answer to {cmd}: {e}"))?;
    serde_json::from_str(&line).map_err(|e| format!("the answer to {cmd} {line:?}: {e}"))
}

/// Reboot into what the daemon installed, start the daemon of that boot
/// and wait until it has committed `version`.
fn settle(dev: &mut Device, version: &str) -> Result {
    dev.wait_reboot_requested(WAIT);
    dev.reboot();
    dev.start_daemon();
    dev.wait_for(&format!("release {version} committed"), WAIT, |s| {
        s["state"] == "idle" && s["running_version"] == version
    });
    Ok(())
}

/// `VmRSS` and `VmHWM` of `pid`, KiB.
fn proc_kib(pid: u32) -> Result<(u64, u64)> {
    super::daemon::proc_status(pid).map(|m| (m.rss, m.hwm))
}

/// What the daemon holds at one point of the run.
struct Sample {
    at: u64,
    secs: f64,
    rss: u64,
    hwm: u64,
    fds: u64,
    db: u64,
    outbox: u64,
    history: u64,
    /// The peak of the daemon that installed (cycles only).
    install_hwm: Option<u64>,
}

impl Sample {
    fn line(&self, unit: &str) -> String {
        format!(
            "{:>7} {unit} {:>6.0} s: VmRSS {} KiB, VmHWM {} KiB, {} fds, database {} bytes, outbox {}, history {}{}",
            self.at,
            self.secs,
            self.rss,
            self.hwm,
            self.fds,
            self.db,
            self.outbox,
            self.history,
            self.install_hwm
                .map(|h| format!(", installer's VmHWM {h} KiB"))
                .unwrap_or_default()
        )
    }
}

fn sample(dev: &Device, at: u64, since: Instant) -> Result<Sample> {
    let pid = dev.daemon_pid().ok_or("the daemon is not running")?;
    let (rss, hwm) = proc_kib(pid)?;
    let fd_dir = format!("/proc/{pid}/fd");
    let fds = std::fs::read_dir(&fd_dir)
        .map_err(|e| format!("reading {fd_dir}: {e}"))?
        .count() as u64;
    let db_path = dev.state_dir.join("updraft.db");
    let db = std::fs::metadata(&db_path)
        .map_err(|e| format!("{}: {e}", db_path.display()))?
        .len();
    let status = ask(&dev.socket, "status")?;
    let outbox = status["status"]["outbox"].as_u64().unwrap_or(0);
    let history = ask(&dev.socket, "history")?["history"]
        .as_array()
        .map_or(0, |h| h.len() as u64);
    Ok(Sample {
        at,
        secs: since.elapsed().as_secs_f64(),
        rss,
        hwm,
        fds,
        db,
        outbox,
        history,
        install_hwm: None,
    })
}

/// Each curve's first value, its value after a tenth of the run, at half
/// of it and at the end, and the change over the second half: a curve that
/// is flat after warm-up changes by nothing there (the history, for one,
/// grows until it reaches the entries kept, then stays).
fn print_curves(title: &str, s: &[Sample]) {
    let (Some(first), Some(last)) = (s.first(), s.last()) else {
        return;
    };
    let at = |part: u64| s.iter().find(|x| x.at * part >= last.at).unwrap_or(last);
    let (tenth, half) = (at(10), at(2));
    println!(
        "\n{title}: start (0), a tenth ({}), half ({}), end ({})",
        tenth.at, half.at, last.at
    );
    let mut rows = vec![vec![
        "curve".to_string(),
        "start".into(),
        "a tenth".into(),
        "half".into(),
        "end".into(),
        "second half".into(),
    ]];
    let mut row = |name: &str, f: &dyn Fn(&Sample) -> Option<u64>| {
        let cell = |x: &Sample| f(x).map_or("-".to_string(), |v| v.to_string());
        let change = match (f(half), f(last)) {
            (Some(a), Some(b)) => format!("{:+}", b as i64 - a as i64),
            _ => "-".into(),
        };
        rows.push(vec![
            name.to_string(),
            cell(first),
            cell(tenth),
            cell(half),
            cell(last),
            change,
        ]);
    };
    row("VmRSS (KiB)", &|x| Some(x.rss));
    row("VmHWM (KiB)", &|x| Some(x.hwm));
    row("open descriptors", &|x| Some(x.fds));
    row("database (bytes)", &|x| Some(x.db));
    row("outbox rows", &|x| Some(x.outbox));
    row("history entries listed (at most 200)", &|x| Some(x.history));
    row("installer's VmHWM (KiB)", &|x| x.install_hwm);
    print_table(&rows);
}
