//! `cargo xtask bench daemon [--seconds N] [--interval SECS] [--runs N]`:
//! what an idle daemon costs, and how fast `updraft check` starts an
//! install, against a real nginx over TLS on loopback.
//!
//! Three simulated devices (the test-support [`Device`]: slot files, the
//! `file` bootloader, the release `updraft` binary) each install release
//! 1.0.0 through their daemon, reboot into it and commit it, exactly as in
//! the field. Then each gets a fresh daemon that polls its own nginx every
//! `--interval` seconds for `--seconds`; the manifest does not change, so
//! every poll after the first is a conditional GET answered `304`. Reports
//! go to a collector behind the same nginx, as a fleet would configure it.
//!
//! * `keep-alive`: nginx keeps idle connections 75 s, so polls share one
//!   TLS connection; a byte-counting proxy sits in between.
//! * `new connection`: nginx closes every connection after its request
//!   (`keepalive_timeout 0`), as happens when polls are further apart than
//!   any server keeps a connection; each poll reconnects and resumes the TLS
//!   session. Also behind a byte-counting proxy.
//! * `no system roots`: like `keep-alive` but `server.system_roots = false`,
//!   so the difference is what parsing the system CA bundle costs.
//!
//! Half an interval after each daemon's tenth idle poll (when that poll and
//! any report are over) it takes the memory snapshot the figures are about:
//! `VmRSS`/`VmHWM` and the thread count from `/proc/PID/status`, `Rss`,
//! `Pss`, `Anonymous` and `Private_Dirty` from `/proc/PID/smaps_rollup`, and
//! the same per mapping from `/proc/PID/smaps`, grouped into the binary's
//! code and data, each shared library, the heap, thread stacks, glibc's
//! per-thread malloc arenas and other anonymous mappings. At the end of the
//! window it reads `VmRSS`/`VmHWM` once more, HTTP bytes
//! per poll from nginx's access log (`$request_length + $bytes_sent`), TCP
//! payload bytes per poll cycle from the proxies, and counts system calls
//! of a few idle polls with strace. Then, with the first device polling
//! hourly and talking to nginx directly, it publishes a new release several
//! times and measures the time from invoking `updraft check` until nginx
//! sees the artifact GET begin (`$msec - $request_time`), and until the
//! command returns; `--runs 0` skips that part.
//!
//! `--arch aarch64` runs the daemons' `updraft` as the aarch64 release
//! build (cross-compiled as `cargo xtask bench size` does) under
//! `qemu-aarch64-static`; the publisher stays native. qemu is told to keep
//! the whole guest address space in one reserved range of its own
//! (`-B`/`-R`), so the guest's memory is exactly the mappings inside that
//! range of the qemu process's `/proc/PID/smaps`: that is what the idle
//! table reports for aarch64, with qemu's own total beside it. The latency
//! runs are skipped there (emulated CPU time says nothing about a board).
//!
//! Timings are printed, never asserted. Everything runs on loopback; every
//! process started here (nginx, daemons, strace) is stopped by its PID.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use updraft_tests::ca::TestCa;
use updraft_tests::collector::Collector;
use updraft_tests::device::{Device, DeviceSpec};
use updraft_tests::nginx::{AccessEntry, Nginx};
use updraft_tests::proxy::{Proxy, Totals};
use updraft_tests::publisher::{KeyPair, Repo, image, keygen};
use updraft_tests::tmp::TempDir;

use super::common::{self, fmt_kib, print_table, summary};
use crate::cross;
use crate::util::{self, Result};

const USAGE: &str = "usage: cargo xtask bench daemon [--seconds N] [--interval SECS] [--runs N] [--arch x86_64|aarch64]\n\
    (--runs 0: only the idle figures, no `updraft check` latency; aarch64 runs under qemu-user)";

/// Where qemu-user keeps the aarch64 guest's address space in its own
/// (`-B` guest base, `-R` reserved size): 4 GiB at 16 TiB, far from where
/// the host maps anything.
const GUEST_BASE: u64 = 0x1000_0000_0000;
const GUEST_SPACE: u64 = 0x1_0000_0000;

/// Size of the slots and release images.
const IMAGE: usize = 16 * 1024 * 1024;

/// Reference figures quoted from measurements on this class of machine
/// (idle daemon, resident set size); not measured here.
const REFERENCES: &[(&str, &str)] = &[
    ("Mender client 3.4", "36.9 MiB"),
    ("RAUC 1.8", "13.3 MiB"),
    ("SWUpdate", "15.2 MiB"),
];

const WAIT: Duration = Duration::from_secs(120);

/// Idle polls after which the memory snapshot is taken.
const IDLE_POLLS: usize = 10;

/// Goals from the issue tracker, KiB: idle RSS, and each of Anonymous and
/// Private_Dirty.
const GOAL_RSS: u64 = 4 * 1024;
const GOAL_PRIVATE: u64 = 1536;

pub fn run(args: &[String]) -> Result {
    let f = common::flags(args, &["seconds", "interval", "runs", "arch"])
        .map_err(|e| format!("{e}\n{USAGE}"))?;
    let seconds = common::number_flag(&f, "seconds", 60)?;
    let interval = common::number_flag(&f, "interval", 3)?;
    let mut runs = common::number_flag(&f, "runs", 5)? as usize;
    let emulated = match f.iter().rev().find(|(n, _)| *n == "arch").map(|(_, v)| *v) {
        None | Some("x86_64") => false,
        Some("aarch64") => true,
        Some(other) => return Err(format!("--arch {other:?}: x86_64 or aarch64\n{USAGE}")),
    };
    if !(1..=60).contains(&interval) || seconds < (IDLE_POLLS as u64 + 1) * interval {
        return Err(format!(
            "--interval must be 1..60 s and --seconds at least {} intervals (the memory snapshot is taken after {IDLE_POLLS} polls)\n{USAGE}",
            IDLE_POLLS + 1
        ));
    }
    common::require_tools(&["/usr/sbin/nginx"])
        .or_else(|_| common::require_tools(&["nginx"]))
        .map_err(|_| "nginx is not installed (apt-get install nginx)".to_string())?;
    let started = Instant::now();
    let tmp = TempDir::new("bench-daemon");
    let mut bins = common::release_binaries()?;
    if emulated {
        bins = aarch64_bin_dir(&bins, &tmp.join("bin-aarch64"))?;
        if runs > 0 {
            println!(
                "(aarch64 under qemu-user: no latency runs, emulated CPU time says nothing about a board)"
            );
            runs = 0;
        }
    }
    let space = emulated.then_some((GUEST_BASE, GUEST_BASE + GUEST_SPACE));
    // SAFETY: no other thread exists yet (nginx, proxies and collectors
    // start their threads below), so nothing reads the environment while
    // it changes.
    unsafe {
        std::env::set_var("UPDRAFT_BIN_DIR", &bins);
        std::env::remove_var("UPDRAFT_TEST_RUNNER");
    }

    let key = keygen(tmp.path(), "release");
    let repo = Repo::new(tmp.join("releases"));
    let v1 = tmp.join("1.0.0.img");
    image(&v1, IMAGE, 100);
    repo.release(&[&key], "1.0.0", &v1, &[]);
    let ca = TestCa::new("updraft bench CA").map_err(|e| format!("making a CA: {e}"))?;

    println!("\n== setting up three devices on release 1.0.0 (install, reboot, commit)");
    let kinds = [Kind::KeepAlive, Kind::NewConnection, Kind::NoSystemRoots];
    let mut rigs = Vec::new();
    for kind in kinds {
        rigs.push(Rig::start(kind, &repo, &ca, &key, interval, space)?);
    }
    for r in &mut rigs {
        r.dev.start_daemon();
    }
    for r in &mut rigs {
        r.settle_on("1.0.0")?;
    }

    println!(
        "\n== idle: fresh daemons polling every {interval} s for {seconds} s (manifest unchanged)"
    );
    for r in &mut rigs {
        r.dev.stop_daemon();
        r.mark = r.nginx.access_log().map_err(|e| e.to_string())?.len();
        r.base = r.proxy.as_ref().map(|p| p.totals()).unwrap_or_default();
        r.outbox_before = outbox(&r.dev);
        r.dev.start_daemon();
        r.since = Instant::now();
    }
    let window = Duration::from_secs(seconds);
    let half = Duration::from_millis(interval * 500);
    while rigs
        .iter()
        .any(|r| r.since.elapsed() < window || r.idle.is_none())
    {
        for r in &mut rigs {
            r.sample(half)?;
        }
        if rigs.iter().any(|r| r.since.elapsed() > window + WAIT) {
            return Err(format!(
                "a daemon did not complete {IDLE_POLLS} polls within {} s",
                (window + WAIT).as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let tck = clock_ticks();
    for r in &mut rigs {
        let pid = r.dev.daemon_pid().ok_or("a daemon is not running")?;
        r.mem = Some(proc_status(pid)?);
        r.cpu = proc_cpu(pid, tck)?;
    }

    println!("\n== system calls of idle polls (strace -c -f, keep-alive device)");
    let strace = strace_polls(&mut rigs[0], interval)?;

    // ---- report: idle --------------------------------------------------------
    println!(
        "\n== bench daemon: idle memory, half an interval after the {IDLE_POLLS}th poll (smaps_rollup; KiB)"
    );
    let mut rows = vec![vec![
        "daemon".to_string(),
        "VmRSS".into(),
        "VmHWM".into(),
        "Rss".into(),
        "Pss".into(),
        "Anonymous".into(),
        "Private_Dirty".into(),
        "Private_Clean".into(),
        "Shared_Clean".into(),
        "threads".into(),
    ]];
    let kib = |v: u64| format!("{v} KiB");
    let usage_cells = |u: &Usage| {
        [
            kib(u.rss),
            kib(u.pss),
            kib(u.anonymous),
            kib(u.private_dirty),
            kib(u.private_clean),
            kib(u.shared_clean),
        ]
    };
    for r in &rigs {
        let Some(s) = &r.idle else { continue };
        let (name, hwm) = match s.host {
            None => (format!("updraft, {}", r.kind.label()), kib(s.status.hwm)),
            Some(_) => (
                format!("updraft aarch64 (guest), {}", r.kind.label()),
                "n/a".into(),
            ),
        };
        let mut row = vec![name, kib(s.rss()), hwm];
        row.extend(usage_cells(&s.rollup));
        row.push(s.status.threads.to_string());
        rows.push(row);
        if let Some(host) = &s.host {
            let mut row = vec![
                "  the whole qemu-aarch64 process".to_string(),
                kib(s.status.rss),
                kib(s.status.hwm),
            ];
            row.extend(usage_cells(host));
            rows.push(row);
        }
    }
    for (name, rss) in REFERENCES {
        rows.push(vec![
            format!("{name} (quoted, not measured here)"),
            rss.to_string(),
        ]);
    }
    print_table(&rows);
    if let Some(s) = &rigs[0].idle {
        let verdict = |what: &str, have: u64, goal: u64| {
            if have <= goal {
                format!(
                    "{what} {have} KiB ≤ {goal} KiB: met ({} KiB to spare)",
                    goal - have
                )
            } else {
                format!(
                    "{what} {have} KiB > {goal} KiB: missed by {} KiB",
                    have - goal
                )
            }
        };
        println!("  goals (keep-alive daemon):");
        println!("    {}", verdict("VmRSS", s.rss(), GOAL_RSS));
        println!(
            "    {}",
            verdict("Anonymous", s.rollup.anonymous, GOAL_PRIVATE)
        );
        println!(
            "    {}",
            verdict("Private_Dirty", s.rollup.private_dirty, GOAL_PRIVATE)
        );
        println!(
            "    (Anonymous + Private_Dirty, which counts dirty anonymous pages twice: {} KiB)",
            s.rollup.anonymous + s.rollup.private_dirty
        );
    }
    if let (Some(with), Some(without)) = (&rigs[0].idle, &rigs[2].idle) {
        let bundle = std::fs::read_to_string("/etc/ssl/certs/ca-certificates.crt")
            .map(|t| t.matches("BEGIN CERTIFICATE").count())
            .unwrap_or(0);
        println!(
            "  the system CA bundle ({bundle} certificates) costs {} KiB of anonymous memory (Anonymous {} vs {} KiB with system_roots = false)",
            with.rollup.anonymous as i64 - without.rollup.anonymous as i64,
            with.rollup.anonymous,
            without.rollup.anonymous
        );
    }
    for (i, r) in rigs.iter().enumerate() {
        let Some(s) = &r.idle else { continue };
        if i > 0 && !verbose_maps() {
            break;
        }
        println!(
            "\n  where the {} daemon's memory is (/proc/PID/smaps by mapping, KiB; x = code, r = read-only, rw = data):",
            r.kind.label()
        );
        print_maps(&s.maps);
    }

    println!(
        "\n== bench daemon: idle, at the end of the {seconds} s window{}",
        if emulated {
            " (/proc/PID/status of the whole qemu-aarch64 process)"
        } else {
            ""
        }
    );
    let mut rows = vec![vec![
        "daemon".to_string(),
        "VmRSS".into(),
        "VmHWM".into(),
        "RssAnon".into(),
        "RssFile".into(),
        "Pss".into(),
        "polls".into(),
        "CPU per later poll".into(),
    ]];
    for r in &rigs {
        let polls = r.polls().len();
        let m = r.mem.unwrap_or_default();
        rows.push(vec![
            format!("updraft, {}", r.kind.label()),
            fmt_kib(m.rss as f64),
            fmt_kib(m.hwm as f64),
            fmt_kib(m.anon as f64),
            fmt_kib(m.file as f64),
            fmt_kib(m.pss as f64),
            polls.to_string(),
            match r.cpu_first {
                Some((cpu, n)) if polls > n => format!(
                    "{:.1} ms",
                    r.cpu.saturating_sub(cpu).as_secs_f64() * 1000.0 / (polls - n) as f64
                ),
                _ => "n/a".into(),
            },
        ]);
    }
    print_table(&rows);

    println!("\n  HTTP bytes per idle poll (nginx: $request_length + $bytes_sent, TLS excluded):");
    let mut rows = vec![vec![
        "request".to_string(),
        "status".into(),
        "request".into(),
        "response".into(),
        "total".into(),
    ]];
    let entries = rigs[0].entries();
    let mut seen = std::collections::BTreeSet::new();
    for e in &entries {
        if seen.insert((e.method.clone(), e.uri.clone(), e.status)) {
            rows.push(vec![
                format!("{} {}", e.method, e.uri),
                e.status.to_string(),
                format!("{} B", e.request_length),
                format!("{} B", e.bytes_sent),
                format!("{} B", e.request_length + e.bytes_sent),
            ]);
        }
    }
    print_table(&rows);
    let http_304: Vec<f64> = entries
        .iter()
        .filter(|e| e.status == 304)
        .map(|e| (e.request_length + e.bytes_sent) as f64)
        .collect();
    println!(
        "  goal: one idle poll (request + 304 response headers) ≤ 1 KiB: measured {}",
        summary(&http_304).map_or("n/a (no 304 seen)".into(), |s| format!("{:.0} B", s.median))
    );

    for r in &rigs[..2] {
        println!(
            "\n  wire bytes per poll cycle, {} (TCP payload through the proxy; TCP/IP headers not counted):",
            r.kind.label()
        );
        print_cycles(r);
    }

    println!("\n  state kept by the idle daemons:");
    for r in &rigs {
        let db = r.dev.state_dir.join("updraft.db");
        println!(
            "  {:<28} outbox {} → {} reports, updraft.db {} KiB",
            r.kind.label(),
            r.outbox_before.map_or("?".into(), |n| n.to_string()),
            outbox(&r.dev).map_or("?".into(), |n| n.to_string()),
            std::fs::metadata(&db).map(|m| m.len() / 1024).unwrap_or(0)
        );
    }
    println!("\n{strace}");

    // ---- latency ---------------------------------------------------------------
    let mut rigs = rigs;
    if runs == 0 {
        for r in &mut rigs {
            r.dev.stop_daemon();
        }
        println!(
            "\nbench daemon took {:.0} s (--runs 0: no latency runs)",
            started.elapsed().as_secs_f64()
        );
        return Ok(());
    }
    let first = rigs.remove(0);
    for mut r in rigs {
        r.dev.stop_daemon();
    }
    println!("\n== `updraft check` → install start, {runs} run(s)");
    let lat = latency(first, &repo, &key, &tmp, runs)?;
    println!(
        "\n== bench daemon: `updraft check` → install start (loopback, nginx over TLS, {IMAGE_MIB} MiB image)"
    );
    let mut rows = vec![vec![
        "from invoking `updraft check` until".to_string(),
        "median".into(),
        "min".into(),
        "max".into(),
    ]];
    for (what, v) in [
        ("nginx receives the manifest GET", &lat.manifest),
        ("the command returns (daemon in `downloading`)", &lat.reply),
        ("nginx receives the artifact GET", &lat.artifact),
    ] {
        let s = summary(v);
        let ms = |f: fn(&common::Summary) -> f64| {
            s.as_ref()
                .map_or("n/a".into(), |s| format!("{:.0} ms", f(s)))
        };
        rows.push(vec![
            what.into(),
            ms(|s| s.median),
            ms(|s| s.min),
            ms(|s| s.max),
        ]);
    }
    print_table(&rows);
    println!(
        "  (nginx times are its request start, $msec - $request_time, millisecond resolution)"
    );
    println!(
        "\nbench daemon took {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

const IMAGE_MIB: usize = IMAGE / (1024 * 1024);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    KeepAlive,
    NewConnection,
    NoSystemRoots,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::KeepAlive => "keep-alive",
            Kind::NewConnection => "new connection per poll",
            Kind::NoSystemRoots => "keep-alive, no system roots",
        }
    }
}

/// Memory figures from `/proc/PID/status`, KiB.
#[derive(Clone, Copy, Default)]
pub(super) struct Mem {
    pub(super) rss: u64,
    pub(super) hwm: u64,
    anon: u64,
    file: u64,
    /// Proportional set size: shared pages divided among their users.
    pss: u64,
    threads: u64,
}

/// The fields of `/proc/PID/smaps` (one mapping, or a group of them) and
/// of `/proc/PID/smaps_rollup` (all of them), KiB.
#[derive(Clone, Copy, Default, Debug)]
struct Usage {
    rss: u64,
    pss: u64,
    shared_clean: u64,
    shared_dirty: u64,
    private_clean: u64,
    private_dirty: u64,
    anonymous: u64,
}

impl Usage {
    /// Take in one `Name: N kB` line; false when it is not one of ours.
    fn take(&mut self, line: &str) -> bool {
        let Some((name, rest)) = line.split_once(':') else {
            return false;
        };
        let field = match name {
            "Rss" => &mut self.rss,
            "Pss" => &mut self.pss,
            "Shared_Clean" => &mut self.shared_clean,
            "Shared_Dirty" => &mut self.shared_dirty,
            "Private_Clean" => &mut self.private_clean,
            "Private_Dirty" => &mut self.private_dirty,
            "Anonymous" => &mut self.anonymous,
            _ => return false,
        };
        match rest.trim().trim_end_matches("kB").trim().parse::<u64>() {
            Ok(v) => {
                *field += v;
                true
            }
            Err(_) => false,
        }
    }

    fn add(&mut self, o: &Usage) {
        self.rss += o.rss;
        self.pss += o.pss;
        self.shared_clean += o.shared_clean;
        self.shared_dirty += o.shared_dirty;
        self.private_clean += o.private_clean;
        self.private_dirty += o.private_dirty;
        self.anonymous += o.anonymous;
    }
}

/// The memory of an idle daemon at one moment.
struct Snapshot {
    status: Mem,
    /// The daemon's memory: the whole process, or under qemu-user the
    /// mappings inside the guest's address space.
    rollup: Usage,
    /// By group of mappings, largest Rss first.
    maps: Vec<(String, Usage)>,
    /// Under qemu-user: the whole emulator process (guest and qemu).
    host: Option<Usage>,
}

impl Snapshot {
    /// `space`: the guest's address range inside an emulator process.
    fn take(pid: u32, space: Option<(u64, u64)>) -> Result<Snapshot> {
        let path = format!("/proc/{pid}/smaps_rollup");
        let text = std::fs::read_to_string(&path).map_err(|e| format!("reading {path}: {e}"))?;
        let mut whole = Usage::default();
        for line in text.lines() {
            whole.take(line);
        }
        let maps = smaps(pid, space)?;
        let (rollup, host) = match space {
            None => (whole, None),
            Some(_) => {
                let mut guest = Usage::default();
                for (_, u) in &maps {
                    guest.add(u);
                }
                (guest, Some(whole))
            }
        };
        Ok(Snapshot {
            status: proc_status(pid)?,
            rollup,
            maps,
            host,
        })
    }

    /// Resident memory of the daemon: `VmRSS`, or the guest's share of an
    /// emulator process.
    fn rss(&self) -> u64 {
        match self.host {
            None => self.status.rss,
            Some(_) => self.rollup.rss,
        }
    }
}

/// Whether to print the mapping breakdown of every daemon, not only the
/// keep-alive one (`UPDRAFT_BENCH_MAPS=all`).
fn verbose_maps() -> bool {
    std::env::var("UPDRAFT_BENCH_MAPS").is_ok_and(|v| v == "all")
}

fn print_maps(maps: &[(String, Usage)]) {
    let mut rows = vec![vec![
        "mapping".to_string(),
        "Rss".into(),
        "Pss".into(),
        "Anonymous".into(),
        "Private_Dirty".into(),
        "Shared_Clean".into(),
    ]];
    let mut total = Usage::default();
    for (name, u) in maps {
        total.add(u);
        rows.push(vec![
            name.clone(),
            u.rss.to_string(),
            u.pss.to_string(),
            u.anonymous.to_string(),
            u.private_dirty.to_string(),
            u.shared_clean.to_string(),
        ]);
    }
    rows.push(vec![
        "total".into(),
        total.rss.to_string(),
        total.pss.to_string(),
        total.anonymous.to_string(),
        total.private_dirty.to_string(),
        total.shared_clean.to_string(),
    ]);
    print_table(&rows);
}

/// A device with its own nginx, collector and (maybe) proxy.
struct Rig {
    kind: Kind,
    dev: Device,
    nginx: Nginx,
    _collector: Collector,
    proxy: Option<Proxy>,
    /// Access-log length when the measured daemon started.
    mark: usize,
    /// Proxy totals when the measured daemon started.
    base: Totals,
    since: Instant,
    /// Manifest GETs seen, and when the cycle snapshot is due.
    seen: usize,
    due: Option<Instant>,
    /// Proxy totals at the middle of each poll cycle.
    snapshots: Vec<Totals>,
    mem: Option<Mem>,
    /// Memory after [`IDLE_POLLS`] polls.
    idle: Option<Snapshot>,
    cpu: Duration,
    /// CPU time and polls when the first poll cycle was over.
    cpu_first: Option<(Duration, usize)>,
    outbox_before: Option<u64>,
    /// The guest's address range when the daemon runs under qemu-user.
    space: Option<(u64, u64)>,
}

impl Rig {
    fn start(
        kind: Kind,
        repo: &Repo,
        ca: &TestCa,
        key: &KeyPair,
        interval: u64,
        space: Option<(u64, u64)>,
    ) -> Result<Rig> {
        let collector = Collector::start().map_err(|e| format!("starting a collector: {e}"))?;
        let keepalive = if kind == Kind::NewConnection { 0 } else { 75 };
        let nginx = Nginx::builder(&repo.dir)
            .ca(ca)
            .keepalive_timeout(keepalive)
            .report_to("/report", collector.addr())
            .start()
            .map_err(|e| format!("starting nginx: {e}"))?;
        let proxy = match kind {
            Kind::NoSystemRoots => None,
            _ => Some(Proxy::start(nginx.addr()).map_err(|e| format!("starting a proxy: {e}"))?),
        };
        let base = match &proxy {
            Some(p) => format!("https://{}", p.addr()),
            None => format!("https://{}", nginx.addr()),
        };
        let mut spec = DeviceSpec::simple(key);
        spec.slot_size = IMAGE as u64;
        spec.server = server_toml(
            &format!("{base}/manifest.json"),
            &format!("{base}/report"),
            nginx.ca_file(),
            &format!("{interval}s"),
            kind != Kind::NoSystemRoots,
        );
        let dev = Device::new(&format!("bench-{}", kind.label()), spec);
        dev.init();
        Ok(Rig {
            kind,
            dev,
            nginx,
            _collector: collector,
            proxy,
            mark: 0,
            base: Totals::default(),
            since: Instant::now(),
            seen: 0,
            due: None,
            snapshots: Vec::new(),
            mem: None,
            idle: None,
            cpu: Duration::ZERO,
            cpu_first: None,
            outbox_before: None,
            space,
        })
    }

    /// Wait until the daemon has installed `version`, reboot, and wait
    /// until the new daemon has committed it and gone idle.
    fn settle_on(&mut self, version: &str) -> Result {
        self.dev.wait_reboot_requested(WAIT);
        self.dev.reboot();
        self.dev.start_daemon();
        self.dev
            .wait_for(&format!("release {version} committed"), WAIT, |s| {
                s["state"] == "idle" && s["running_version"] == version
            });
        println!(
            "  {:<28} running {version} in slot {}",
            self.kind.label(),
            self.dev.booted()
        );
        Ok(())
    }

    /// Access-log entries of the measured daemon.
    fn entries(&self) -> Vec<AccessEntry> {
        self.nginx
            .access_log()
            .unwrap_or_default()
            .into_iter()
            .skip(self.mark)
            .collect()
    }

    /// The manifest GETs of the measured daemon.
    fn polls(&self) -> Vec<AccessEntry> {
        self.entries()
            .into_iter()
            .filter(|e| e.uri.ends_with("/manifest.json"))
            .collect()
    }

    /// Take a proxy snapshot half an interval after each new poll, when the
    /// poll and any report it caused are over.
    fn sample(&mut self, half: Duration) -> Result {
        if let Some(due) = self.due {
            if Instant::now() >= due {
                if let Some(p) = &self.proxy {
                    self.snapshots.push(p.totals());
                }
                if self.cpu_first.is_none() {
                    if let Some(pid) = self.dev.daemon_pid() {
                        self.cpu_first = Some((proc_cpu(pid, clock_ticks())?, self.seen));
                    }
                }
                if self.idle.is_none() && self.seen >= IDLE_POLLS {
                    let pid = self.dev.daemon_pid().ok_or("a daemon is not running")?;
                    self.idle = Some(Snapshot::take(pid, self.space)?);
                }
                self.due = None;
            }
            return Ok(());
        }
        let n = self.polls().len();
        if n > self.seen {
            self.seen = n;
            self.due = Some(Instant::now() + half);
        }
        Ok(())
    }
}

/// A directory whose `updraft` runs the aarch64 release build under
/// qemu-user with the guest kept in [`GUEST_BASE`]..+[`GUEST_SPACE`], and
/// whose `updraft-publish` is the native one from `native`.
fn aarch64_bin_dir(native: &Path, dir: &Path) -> Result<PathBuf> {
    let t = cross::TARGETS
        .iter()
        .find(|t| t.short == "aarch64")
        .ok_or("no aarch64 target is defined")?;
    println!("building the aarch64 release binary ({})", t.triple);
    let binary = cross::release_agent(t)?;
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let script = format!(
        "#!/bin/sh\nexec {} -B {GUEST_BASE:#x} -R {GUEST_SPACE:#x} {} \"$@\"\n",
        t.runner(),
        binary.display()
    );
    let wrapper = dir.join("updraft");
    std::fs::write(&wrapper, script).map_err(|e| format!("writing {}: {e}", wrapper.display()))?;
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .map_err(|e| format!("making {} executable: {e}", wrapper.display()))?;
    let publish = dir.join("updraft-publish");
    let _ = std::fs::remove_file(&publish);
    std::os::unix::fs::symlink(native.join("updraft-publish"), &publish)
        .map_err(|e| format!("linking {}: {e}", publish.display()))?;
    Ok(dir.to_path_buf())
}

fn server_toml(manifest: &str, report: &str, ca: &Path, poll: &str, system_roots: bool) -> String {
    format!(
        "manifest_url = {manifest:?}\nreport_url = {report:?}\nca_file = {ca:?}\n\
         system_roots = {system_roots}\npoll_interval = {poll:?}\npoll_jitter = \"0s\"\n\
         retry_max = \"5s\"\n"
    )
}

/// Print one row per poll cycle: which requests, on which connection, with
/// what TLS, and the proxy's byte counts.
fn print_cycles(r: &Rig) {
    let entries = r.entries();
    let polls: Vec<usize> = entries
        .iter()
        .enumerate()
        .filter(|(_, e)| e.uri.ends_with("/manifest.json"))
        .map(|(i, _)| i)
        .collect();
    let mut rows = vec![vec![
        "poll".to_string(),
        "nginx connection".into(),
        "TLS".into(),
        "requests".into(),
        "up".into(),
        "down".into(),
        "total".into(),
    ]];
    let mut prev_conn = None;
    let mut prev_totals = r.base;
    let mut later = Vec::new();
    for (k, &start) in polls.iter().enumerate() {
        let end = polls.get(k + 1).copied().unwrap_or(entries.len());
        let cycle = &entries[start..end];
        let conns: Vec<u64> = {
            let mut c: Vec<u64> = cycle.iter().map(|e| e.connection).collect();
            c.dedup();
            c
        };
        let e = &entries[start];
        let tls = if prev_conn == Some(e.connection) {
            "same connection".to_string()
        } else if e.ssl_session_reused {
            "new, session resumed".to_string()
        } else {
            "new, full handshake".to_string()
        };
        prev_conn = cycle.last().map(|e| e.connection);
        let reqs: Vec<String> = cycle
            .iter()
            .map(|e| format!("{} {} {}", e.method, e.uri, e.status))
            .collect();
        let (up, down) = match r.snapshots.get(k) {
            Some(t) => (
                t.to_server.saturating_sub(prev_totals.to_server),
                t.to_client.saturating_sub(prev_totals.to_client),
            ),
            None => (0, 0),
        };
        if let Some(t) = r.snapshots.get(k) {
            prev_totals = *t;
        }
        let have = r.snapshots.get(k).is_some();
        if k > 0 && have {
            later.push((up + down) as f64);
        }
        if k < 4 || k + 1 == polls.len() {
            rows.push(vec![
                (k + 1).to_string(),
                conns
                    .iter()
                    .map(|c| format!("#{c}"))
                    .collect::<Vec<_>>()
                    .join(" "),
                tls,
                reqs.join(", "),
                if have { format!("{up} B") } else { "-".into() },
                if have {
                    format!("{down} B")
                } else {
                    "-".into()
                },
                if have {
                    format!("{} B", up + down)
                } else {
                    "-".into()
                },
            ]);
        } else if k == 4 {
            rows.push(vec!["…".into()]);
        }
    }
    print_table(&rows);
    if let Some(s) = summary(&later) {
        println!(
            "  polls 2..{}: median {:.0} B per poll cycle (min {:.0}, max {:.0}); {} TCP connection(s) in all",
            polls.len(),
            s.median,
            s.min,
            s.max,
            r.proxy
                .as_ref()
                .map(|p| p.totals().connections - r.base.connections)
                .unwrap_or(0)
        );
    }
}

/// `outbox` from `updraft status --json`.
fn outbox(dev: &Device) -> Option<u64> {
    let out = dev.updraft(&["status", "--json"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let key = "\"outbox\":";
    let at = text.find(key)? + key.len();
    text[at..]
        .trim_start()
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

pub(super) fn proc_status(pid: u32) -> Result<Mem> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("reading {path}: {e}"))?;
    let kib = |name: &str| -> Result<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .ok_or_else(|| format!("{path} has no {name}"))
    };
    let rollup = format!("/proc/{pid}/smaps_rollup");
    let pss = std::fs::read_to_string(&rollup)
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("Pss:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0);
    Ok(Mem {
        rss: kib("VmRSS:")?,
        hwm: kib("VmHWM:")?,
        anon: kib("RssAnon:")?,
        file: kib("RssFile:")?,
        pss,
        threads: kib("Threads:")?,
    })
}

/// Memory per group of mappings of a process, largest Rss first: a file's
/// mappings by kind of access, and anonymous ones by what they are. A
/// thread's stack is a writable anonymous mapping right above its guard
/// page (an inaccessible mapping of at most 64 KiB); glibc's per-thread
/// malloc heaps are writable anonymous mappings aligned to their 64 MiB
/// reservation (32 MiB on 32-bit), the rest of which is inaccessible.
///
/// With `within`, only the mappings inside that address range count (the
/// guest of a qemu-user process; addresses are taken relative to its start).
fn smaps(pid: u32, within: Option<(u64, u64)>) -> Result<Vec<(String, Usage)>> {
    let path = format!("/proc/{pid}/smaps");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("reading {path}: {e}"))?;
    let arena_align: u64 = if cfg!(target_pointer_width = "64") {
        64 << 20
    } else {
        32 << 20
    };
    let mut groups: std::collections::BTreeMap<String, Usage> = std::collections::BTreeMap::new();
    let mut current: Option<String> = None;
    // The previous mapping: end address, inaccessible, anonymous, size.
    let mut prev: Option<(u64, bool, bool, u64)> = None;
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let range = f.first().and_then(|a| {
            let (lo, hi) = a.split_once('-')?;
            Some((
                u64::from_str_radix(lo, 16).ok()?,
                u64::from_str_radix(hi, 16).ok()?,
            ))
        });
        if let (Some((lo, hi)), Some(perms)) = (range, f.get(1).filter(|p| p.len() == 4)) {
            if within.is_some_and(|(start, end)| lo < start || hi > end) {
                prev = None;
                current = None;
                continue;
            }
            let lo = lo - within.map_or(0, |(start, _)| start);
            let hi = hi - within.map_or(0, |(start, _)| start);
            let kind = if perms.contains('x') {
                "x"
            } else if perms.contains('w') {
                "rw"
            } else if perms.contains('r') {
                "r"
            } else {
                "none"
            };
            let file = f.get(5).copied();
            let name = match file {
                Some(p) if p.starts_with('[') => format!("{p} ({kind})"),
                Some(p) => format!(
                    "{} ({kind})",
                    Path::new(p)
                        .file_name()
                        .map_or(p.to_string(), |n| n.to_string_lossy().into_owned())
                ),
                None if kind == "rw" => {
                    let after_guard = prev.is_some_and(|(end, none, anon, size)| {
                        end == lo && none && anon && size <= 64 * 1024
                    });
                    if after_guard {
                        "thread stacks (rw)".to_string()
                    } else if lo % arena_align == 0 {
                        "malloc thread arenas (rw)".to_string()
                    } else {
                        "other anonymous (rw)".to_string()
                    }
                }
                None => format!("anonymous ({kind})"),
            };
            prev = Some((hi, kind == "none", file.is_none(), hi - lo));
            current = Some(name);
        } else if let Some(c) = &current {
            let mut one = Usage::default();
            if one.take(line) {
                groups.entry(c.clone()).or_default().add(&one);
            }
        }
    }
    let mut out: Vec<(String, Usage)> = groups.into_iter().filter(|(_, u)| u.rss > 0).collect();
    out.sort_by_key(|e| std::cmp::Reverse(e.1.rss));
    Ok(out)
}

/// Clock ticks per second, for `/proc/PID/stat`.
fn clock_ticks() -> u64 {
    util::output(Command::new("getconf").arg("CLK_TCK"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .filter(|&t| t > 0)
        .unwrap_or(100)
}

/// User + system CPU time of a process so far.
fn proc_cpu(pid: u32, tck: u64) -> Result<Duration> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("reading {path}: {e}"))?;
    // Fields after the command name, which is in parentheses and may hold
    // spaces: state is field 3, utime 14, stime 15.
    let rest = text
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| format!("{path}: no command name"))?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let num = |i: usize| -> Result<u64> {
        f.get(i)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("{path}: field {} is not a number", i + 3))
    };
    let ticks = num(11)? + num(12)?;
    Ok(Duration::from_millis(ticks * 1000 / tck))
}

/// Count the system calls of the keep-alive daemon over a few polls.
fn strace_polls(r: &mut Rig, interval: u64) -> Result<String> {
    if !util::have("strace") || !util::have("timeout") {
        return Ok("  (strace not installed: apt-get install strace)".into());
    }
    let pid = r.dev.daemon_pid().ok_or("the daemon is not running")?;
    let secs = interval * 4;
    let out = r.dev.path("strace.txt");
    let before = r.polls().len();
    let mut cmd = Command::new("timeout");
    cmd.args([
        "-s",
        "INT",
        &secs.to_string(),
        "strace",
        "-q",
        "-f",
        "-c",
        "-o",
    ])
    .arg(&out)
    .arg("-p")
    .arg(pid.to_string());
    println!("  {}", common::shell_line(&cmd));
    // `timeout` exits 124 when it had to stop strace, which is the plan.
    let _ = cmd
        .output()
        .map_err(|e| format!("running {}: {e}", common::shell_line(&cmd)))?;
    let polls = r.polls().len() - before;
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let mut s = format!(
        "  system calls over {secs} s of idle polling ({polls} poll(s), keep-alive device):\n"
    );
    let mut rows = Vec::new();
    for l in text.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        // % time, seconds, usecs/call, calls, [errors], syscall
        if f.len() >= 5 && f[0].parse::<f64>().is_ok() {
            let calls: u64 = f[3].parse().unwrap_or(0);
            let name = f[f.len() - 1];
            rows.push((name.to_string(), calls));
        }
    }
    rows.sort_by_key(|e| std::cmp::Reverse(e.1));
    let per = |n: u64| {
        if polls > 0 {
            format!("{:.1}", n as f64 / polls as f64)
        } else {
            "n/a".into()
        }
    };
    for (name, calls) in rows.iter().take(12) {
        s.push_str(&format!(
            "    {name:<16} {calls:>6} calls, {} per poll\n",
            per(*calls)
        ));
    }
    for want in ["fsync", "fdatasync", "openat", "pwrite64"] {
        if !rows.iter().take(12).any(|(n, _)| n == want) {
            if let Some((name, calls)) = rows.iter().find(|(n, _)| n == want) {
                s.push_str(&format!(
                    "    {name:<16} {calls:>6} calls, {} per poll\n",
                    per(*calls)
                ));
            }
        }
    }
    Ok(s)
}

struct Latency {
    manifest: Vec<f64>,
    reply: Vec<f64>,
    artifact: Vec<f64>,
}

/// Milliseconds from `t0` to when nginx began the request of `e`.
fn started_ms(e: &AccessEntry, t0: SystemTime) -> f64 {
    let begin = e.time - Duration::from_millis(e.request_time_ms);
    match begin.duration_since(t0) {
        Ok(d) => d.as_secs_f64() * 1000.0,
        Err(early) => -early.duration().as_secs_f64() * 1000.0,
    }
}

fn latency(mut r: Rig, repo: &Repo, key: &KeyPair, tmp: &TempDir, runs: usize) -> Result<Latency> {
    // Talk to nginx directly and poll only hourly, so the only checks are
    // the one at start and the ones asked for.
    let base = format!("https://{}", r.nginx.addr());
    let ca: PathBuf = r.nginx.ca_file().to_path_buf();
    r.dev.stop_daemon();
    r.dev.reconfigure(|s| {
        s.server = server_toml(
            &format!("{base}/manifest.json"),
            &format!("{base}/report"),
            &ca,
            "1h",
            true,
        )
    });
    let mut lat = Latency {
        manifest: Vec::new(),
        reply: Vec::new(),
        artifact: Vec::new(),
    };
    start_and_wait_first_poll(&mut r)?;
    for run in 0..runs {
        let version = format!("1.{}.0", run + 1);
        let img = tmp.join(format!("{version}.img"));
        image(&img, IMAGE, 200 + run as u64);
        // nginx's ETag is the file's mtime (seconds) and size: make sure the
        // new manifest cannot share it with the previous one.
        std::thread::sleep(Duration::from_millis(1100));
        repo.release(&[key], &version, &img, &[]);
        let mark = r.nginx.access_log().map_err(|e| e.to_string())?.len();
        let t0 = SystemTime::now();
        let i0 = Instant::now();
        let out = r.dev.updraft(&["check"]);
        let reply = i0.elapsed().as_secs_f64() * 1000.0;
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() || !said.contains("installing") {
            return Err(format!(
                "updraft check did not start an install of {version} ({}): {said}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let log = wait_artifact_get(&r, mark)?;
        let new: Vec<&AccessEntry> = log.iter().skip(mark).collect();
        let manifest = new
            .iter()
            .find(|e| e.uri.ends_with("/manifest.json"))
            .map(|e| started_ms(e, t0));
        let artifact = new
            .iter()
            .find(|e| e.method == "GET" && e.uri.contains("/artifacts/"))
            .map(|e| started_ms(e, t0))
            .ok_or("nginx logged no artifact GET")?;
        println!(
            "  run {}/{runs}: release {version}: manifest GET at {}, check returned at {reply:.0} ms, artifact GET at {artifact:.0} ms",
            run + 1,
            manifest.map_or("?".into(), |m| format!("{m:.0} ms")),
        );
        if let Some(m) = manifest {
            lat.manifest.push(m);
        }
        lat.reply.push(reply);
        lat.artifact.push(artifact);
        r.settle_on(&version)?;
        r.dev.stop_daemon();
        start_and_wait_first_poll(&mut r)?;
    }
    if util::have("strace") && util::have("timeout") {
        strace_check(&mut r, repo, key, tmp, runs + 1)?;
    }
    r.dev.stop_daemon();
    Ok(lat)
}

/// One more check under `strace -f -ttt -T`: which system calls fill the
/// time between invoking `updraft check` and the artifact GET.
fn strace_check(r: &mut Rig, repo: &Repo, key: &KeyPair, tmp: &TempDir, n: usize) -> Result {
    let version = format!("1.{n}.0");
    let img = tmp.join(format!("{version}.img"));
    image(&img, IMAGE, 200 + n as u64);
    std::thread::sleep(Duration::from_millis(1100));
    repo.release(&[key], &version, &img, &[]);
    let pid = r.dev.daemon_pid().ok_or("the daemon is not running")?;
    let out = r.dev.path("strace-check.txt");
    let mut cmd = Command::new("timeout");
    cmd.args(["-s", "INT", "4", "strace", "-q", "-f", "-ttt", "-T", "-o"])
        .arg(&out)
        .arg("-p")
        .arg(pid.to_string());
    let mut tracer = cmd
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("starting {}: {e}", common::shell_line(&cmd)))?;
    std::thread::sleep(Duration::from_millis(500));
    let mark = r.nginx.access_log().map_err(|e| e.to_string())?.len();
    let t0 = SystemTime::now();
    let done = r.dev.updraft(&["check"]);
    if !done.status.success() {
        let _ = tracer.wait();
        return Err(format!(
            "updraft check under strace failed: {}",
            String::from_utf8_lossy(&done.stderr)
        ));
    }
    let log = wait_artifact_get(r, mark)?;
    let _ = tracer.wait();
    let artifact = log
        .iter()
        .skip(mark)
        .find(|e| e.method == "GET" && e.uri.contains("/artifacts/"))
        .map(|e| e.time - Duration::from_millis(e.request_time_ms))
        .ok_or("nginx logged no artifact GET")?;
    let secs = |t: SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0)
    };
    let (from, to) = (secs(t0), secs(artifact));
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let mut per: std::collections::BTreeMap<String, (u64, f64)> = Default::default();
    for line in text.lines() {
        // PID SECONDS.MICROS name(args) = result <duration>
        let mut f = line.splitn(3, ' ');
        let (Some(_), Some(ts), Some(rest)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let Ok(ts) = ts.parse::<f64>() else { continue };
        if ts < from || ts > to {
            continue;
        }
        let Some(name) = rest
            .split('(')
            .next()
            .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
        else {
            continue;
        };
        let dur = rest
            .rsplit_once('<')
            .and_then(|(_, d)| d.trim_end_matches('>').parse::<f64>().ok())
            .unwrap_or(0.0);
        let e = per.entry(name.to_string()).or_default();
        e.0 += 1;
        e.1 += dur;
    }
    let mut rows: Vec<(String, (u64, f64))> = per.into_iter().collect();
    rows.sort_by(|a, b| b.1.1.total_cmp(&a.1.1));
    println!(
        "  one more check under strace (not in the figures): artifact GET {:.0} ms after invoking `updraft check` (strace slows the daemon); the daemon's system calls in between, by time spent:",
        (to - from) * 1000.0
    );
    for (name, (calls, dur)) in rows.iter().take(8) {
        println!("    {name:<16} {calls:>5} calls {:>8.1} ms", dur * 1000.0);
    }
    r.settle_on(&version)?;
    Ok(())
}

/// Start the daemon and wait until its first (start-up) poll is logged and
/// it is idle again.
fn start_and_wait_first_poll(r: &mut Rig) -> Result {
    let mark = r.nginx.access_log().map_err(|e| e.to_string())?.len();
    r.dev.start_daemon();
    r.nginx
        .wait_access_log(WAIT, |l| {
            l.iter()
                .skip(mark)
                .any(|e| e.uri.ends_with("/manifest.json"))
        })
        .map_err(|e| e.to_string())?;
    r.dev.wait_for("idle after the start-up poll", WAIT, |s| {
        s["state"] == "idle"
    });
    Ok(())
}

/// The access log once an artifact GET appears after entry `mark`.
fn wait_artifact_get(r: &Rig, mark: usize) -> Result<Vec<AccessEntry>> {
    r.nginx
        .wait_access_log(WAIT, |l| {
            l.iter()
                .skip(mark)
                .any(|e| e.method == "GET" && e.uri.contains("/artifacts/"))
        })
        .map_err(|e| e.to_string())
}
