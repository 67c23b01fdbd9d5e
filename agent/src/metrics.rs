//! Metrics for node_exporter's textfile collector: a Prometheus text
//! exposition file (format 0.0.4), replaced atomically, no listening port.
//!
//! The daemon owns one [`Metrics`], updates it as things happen and calls
//! [`Metrics::write`] after each change of state or at the end of a cycle;
//! the file is written to a temporary name in the same directory, fsynced
//! and renamed (see [`crate::fsutil::atomic_write`]), so the collector never
//! reads half a file. node_exporter only reads `*.prom`, and the temporary
//! name does not end in `.prom`.
//!
//! Families (every one with `# HELP` and `# TYPE`):
//!
//! | name | type | meaning |
//! |------|------|---------|
//! | `updraft_build_info{version}` | gauge | 1; the agent's own version |
//! | `updraft_last_check_timestamp_seconds` | gauge | Unix time of the last manifest check (absent before the first) |
//! | `updraft_last_successful_check_timestamp_seconds` | gauge | Unix time of the last check that reached a verified manifest |
//! | `updraft_checks_total` | counter | manifest checks started |
//! | `updraft_errors_total{kind}` | counter | errors by [`Kind::as_str`]; every kind is present from 0 |
//! | `updraft_signature_failures_total` | counter | manifests or key documents whose signatures did not verify |
//! | `updraft_downloaded_bytes_total` | counter | response body bytes received (manifests, key documents, artifacts, deltas) |
//! | `updraft_last_install_duration_seconds` | gauge | from the start of the last committed release's job to its commit, reboot included (absent before the first) |
//! | `updraft_booted_slot{slot}` | gauge | 1 for the booted slot, 0 for the other |
//! | `updraft_release_info{slot,version}` | gauge | 1 per slot whose installed release is known |
//! | `updraft_component_info{component,kind,version}` | gauge | 1 per component running besides the slot (absent before the first) |
//! | `updraft_state{state}` | gauge | 1 for the current state, 0 for every other (a state set) |
//! | `updraft_outbox_depth` | gauge | reports queued, not yet delivered |
//! | `updraft_held_since_timestamp_seconds` | gauge | Unix time since when a verified release waits for the policy (its maintenance window or `updraft apply`); absent when none does |
//! | `updraft_waiting{for}` | gauge | 1 for what a held release waits for now (`window`, `operator`, `inhibitor`), 0 for the others (a state set) |
//! | `updraft_inhibitors` | gauge | applications inhibiting the held release's switch or reboot at the last look |
//!
//! The state is exposed as a state set (one series per state, 0 or 1)
//! rather than one series whose label changes: every series exists from
//! the first write, so `updraft_state{state="testing"} == 1` and
//! `max_over_time(...)` work without gaps or stale series.
//!
//! Counters start at 0 when the daemon starts (Prometheus' `rate` and
//! `increase` handle the reset). Label values are escaped as the format
//! requires (`\\`, `\"`, `\n`), so any release version is safe.
//!
//! This module only counts and renders; it never decides when to write,
//! and it never opens a socket.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use crate::error::{Context, Kind, Result};
use crate::fsutil::atomic_write;
use crate::slot::SlotName;
use crate::timestamp::Timestamp;

/// The states of the update cycle, in the order they are written. A state
/// name not listed here is still written (with 1) when it is current.
pub const STATES: [&str; 10] = crate::state::State::NAMES;

/// Every error kind, in the order they are written.
const KINDS: [Kind; 17] = [
    Kind::Config,
    Kind::Usage,
    Kind::Signature,
    Kind::Policy,
    Kind::Integrity,
    Kind::Malformed,
    Kind::Clock,
    Kind::Network,
    Kind::Slot,
    Kind::Bootloader,
    Kind::Store,
    Kind::Busy,
    Kind::Io,
    Kind::Health,
    Kind::Stopped,
    Kind::Denied,
    Kind::Degraded,
];

/// Position of `kind` in [`KINDS`]. Exhaustive on purpose: a new kind does
/// not compile until it is counted here.
fn kind_index(kind: Kind) -> usize {
    match kind {
        Kind::Config => 0,
        Kind::Usage => 1,
        Kind::Signature => 2,
        Kind::Policy => 3,
        Kind::Integrity => 4,
        Kind::Malformed => 5,
        Kind::Clock => 6,
        Kind::Network => 7,
        Kind::Slot => 8,
        Kind::Bootloader => 9,
        Kind::Store => 10,
        Kind::Busy => 11,
        Kind::Io => 12,
        Kind::Health => 13,
        Kind::Stopped => 14,
        Kind::Denied => 15,
        Kind::Degraded => 16,
    }
}

/// File mode of a newly created metrics file: node_exporter runs as
/// another user and must be able to read it.
pub const FILE_MODE: u32 = 0o644;

/// What the daemon reports to the textfile collector.
#[derive(Clone, Debug, PartialEq)]
pub struct Metrics {
    last_check: Option<Timestamp>,
    last_success: Option<Timestamp>,
    checks: u64,
    errors: [u64; KINDS.len()],
    signature_failures: u64,
    downloaded_bytes: u64,
    last_install: Option<Duration>,
    booted: Option<SlotName>,
    release_a: Option<String>,
    release_b: Option<String>,
    state: String,
    outbox_depth: u64,
    held_since: Option<Timestamp>,
    waiting: Option<String>,
    inhibitors: u64,
    /// (name, kind, version) of each component running besides the slot.
    components: Vec<(String, String, String)>,
}

/// What a held release can wait for (`updraft_waiting`).
const WAITS: [&str; 3] = ["window", "operator", "inhibitor"];

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// All counters at 0, state `idle`, nothing known yet.
    pub fn new() -> Metrics {
        Metrics {
            last_check: None,
            last_success: None,
            checks: 0,
            errors: [0; KINDS.len()],
            signature_failures: 0,
            downloaded_bytes: 0,
            last_install: None,
            booted: None,
            release_a: None,
            release_b: None,
            state: STATES[0].to_string(),
            outbox_depth: 0,
            held_since: None,
            waiting: None,
            inhibitors: 0,
            components: Vec::new(),
        }
    }

    /// A manifest check happened at `at`; `ok` when it reached a verified
    /// manifest (whether or not it named a new release).
    pub fn record_check(&mut self, at: Timestamp, ok: bool) {
        self.checks = self.checks.saturating_add(1);
        self.last_check = Some(at);
        if ok {
            self.last_success = Some(at);
        }
    }

    /// An error of `kind` surfaced (one per failed operation, not per retry
    /// inside it).
    pub fn record_error(&mut self, kind: Kind) {
        let n = &mut self.errors[kind_index(kind)];
        *n = n.saturating_add(1);
    }

    /// A manifest or key document failed signature verification.
    pub fn record_signature_failure(&mut self) {
        self.signature_failures = self.signature_failures.saturating_add(1);
    }

    /// `bytes` more arrived from the server.
    pub fn add_downloaded(&mut self, bytes: u64) {
        self.downloaded_bytes = self.downloaded_bytes.saturating_add(bytes);
    }

    /// A release committed `took` after its job started (reboot included).
    pub fn set_last_install_duration(&mut self, took: Duration) {
        self.last_install = Some(took);
    }

    pub fn set_booted_slot(&mut self, slot: SlotName) {
        self.booted = Some(slot);
    }

    /// The release installed in `slot`, or `None` when unknown or erased.
    pub fn set_release(&mut self, slot: SlotName, version: Option<&str>) {
        let v = version.map(str::to_string);
        match slot {
            SlotName::A => self.release_a = v,
            SlotName::B => self.release_b = v,
        }
    }

    /// The components running besides the slot: (name, kind, version).
    pub fn set_components(&mut self, components: Vec<(String, String, String)>) {
        self.components = components;
    }

    /// The current state by name (`crate::state::State::name`).
    pub fn set_state(&mut self, name: &str) {
        self.state = name.to_string();
    }

    /// Since when a verified release waits for the policy, if one does.
    pub fn set_held_since(&mut self, since: Option<Timestamp>) {
        self.held_since = since;
    }

    /// What a held release waits for (`None`: nothing waits), and how many
    /// inhibitors hold it.
    pub fn set_waiting(&mut self, waiting: Option<&str>, inhibitors: usize) {
        self.waiting = waiting.map(str::to_string);
        self.inhibitors = inhibitors as u64;
    }

    pub fn set_outbox_depth(&mut self, depth: u64) {
        self.outbox_depth = depth;
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        let mut f = Family::new(&mut out);

        f.header(
            "updraft_build_info",
            "gauge",
            "Version of the running updraft agent.",
        );
        f.sample(
            "updraft_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))],
            1,
        );

        if let Some(t) = self.last_check {
            f.header(
                "updraft_last_check_timestamp_seconds",
                "gauge",
                "Unix time of the last manifest check.",
            );
            f.sample("updraft_last_check_timestamp_seconds", &[], t.0);
        }
        if let Some(t) = self.last_success {
            f.header(
                "updraft_last_successful_check_timestamp_seconds",
                "gauge",
                "Unix time of the last manifest check that reached a verified manifest.",
            );
            f.sample("updraft_last_successful_check_timestamp_seconds", &[], t.0);
        }

        f.header(
            "updraft_checks_total",
            "counter",
            "Manifest checks started.",
        );
        f.sample("updraft_checks_total", &[], self.checks);

        f.header("updraft_errors_total", "counter", "Errors by kind.");
        for (kind, n) in KINDS.iter().zip(self.errors) {
            f.sample("updraft_errors_total", &[("kind", kind.as_str())], n);
        }

        f.header(
            "updraft_signature_failures_total",
            "counter",
            "Manifests or key documents whose signatures did not verify.",
        );
        f.sample(
            "updraft_signature_failures_total",
            &[],
            self.signature_failures,
        );

        f.header(
            "updraft_downloaded_bytes_total",
            "counter",
            "Response body bytes received (manifests, key documents, artifacts, deltas).",
        );
        f.sample("updraft_downloaded_bytes_total", &[], self.downloaded_bytes);

        if let Some(d) = self.last_install {
            f.header(
                "updraft_last_install_duration_seconds",
                "gauge",
                "From the start of the last committed release's job to its commit, reboot included.",
            );
            f.sample(
                "updraft_last_install_duration_seconds",
                &[],
                d.as_secs_f64(),
            );
        }

        if let Some(booted) = self.booted {
            f.header(
                "updraft_booted_slot",
                "gauge",
                "1 for the slot the system booted from.",
            );
            for s in [SlotName::A, SlotName::B] {
                f.sample(
                    "updraft_booted_slot",
                    &[("slot", s.as_str())],
                    u8::from(s == booted),
                );
            }
        }

        let releases = [
            (SlotName::A, &self.release_a),
            (SlotName::B, &self.release_b),
        ];
        if releases.iter().any(|(_, v)| v.is_some()) {
            f.header(
                "updraft_release_info",
                "gauge",
                "Release installed in each slot.",
            );
            for (s, v) in releases {
                if let Some(v) = v {
                    f.sample(
                        "updraft_release_info",
                        &[("slot", s.as_str()), ("version", v)],
                        1,
                    );
                }
            }
        }

        if !self.components.is_empty() {
            f.header(
                "updraft_component_info",
                "gauge",
                "Version of each component running besides the slot.",
            );
            for (name, kind, version) in &self.components {
                f.sample(
                    "updraft_component_info",
                    &[("component", name), ("kind", kind), ("version", version)],
                    1,
                );
            }
        }

        f.header(
            "updraft_state",
            "gauge",
            "1 for the current state of the update cycle, 0 for the others.",
        );
        for s in STATES {
            f.sample("updraft_state", &[("state", s)], u8::from(self.state == s));
        }
        if !STATES.contains(&self.state.as_str()) {
            f.sample("updraft_state", &[("state", &self.state)], 1);
        }

        f.header(
            "updraft_outbox_depth",
            "gauge",
            "Reports queued and not yet delivered.",
        );
        f.sample("updraft_outbox_depth", &[], self.outbox_depth);

        if let Some(t) = self.held_since {
            f.header(
                "updraft_held_since_timestamp_seconds",
                "gauge",
                "Unix time since when a verified release waits for the policy (maintenance window or updraft apply).",
            );
            f.sample("updraft_held_since_timestamp_seconds", &[], t.0);
        }

        f.header(
            "updraft_waiting",
            "gauge",
            "What a held release waits for: a maintenance window, an operator's updraft apply, an application inhibitor.",
        );
        for w in WAITS {
            let on = self.waiting.as_deref() == Some(w);
            f.sample("updraft_waiting", &[("for", w)], u8::from(on));
        }
        f.header(
            "updraft_inhibitors",
            "gauge",
            "Applications inhibiting the held release's switch or reboot at the last look.",
        );
        f.sample("updraft_inhibitors", &[], self.inhibitors);

        out
    }

    /// Replace the file at `path` with [`Metrics::render`], atomically.
    pub fn write(&self, path: &Path) -> Result<()> {
        atomic_write(path, self.render().as_bytes(), FILE_MODE)
            .with_context(|| format!("writing metrics to {}", path.display()))
    }
}

/// The warning for a metrics file whose directory other accounts can
/// write (as Debian's node-exporter textfile directory is, for its other
/// collectors), or `None`. Read at start; see [`shared_directory_warning`].
pub fn shared_directory(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let dir = crate::fsutil::parent_dir(path);
    let meta = std::fs::metadata(dir).ok()?;
    let me = nix::unistd::geteuid().as_raw();
    shared_directory_warning(dir, meta.mode(), meta.uid(), me)
}

/// The warning for a metrics directory with permission bits `mode` owned
/// by `owner`, for a daemon running as `me`: one that a group or everyone
/// may write, or that another account (not root) owns. updraft's own
/// writes there are safe (see [`crate::fsutil`]), but whoever can write
/// the directory can replace or remove the metrics file.
pub fn shared_directory_warning(dir: &Path, mode: u32, owner: u32, me: u32) -> Option<String> {
    let writable = mode & 0o022 != 0;
    let foreign = owner != me && owner != 0;
    if !writable && !foreign {
        return None;
    }
    let who = match (writable, foreign) {
        (true, true) => format!("is mode {:04o} and owned by uid {owner}", mode & 0o7777),
        (true, false) => format!("is mode {:04o}", mode & 0o7777),
        _ => format!("is owned by uid {owner}"),
    };
    Some(format!(
        "the metrics directory {} {who}: other accounts can write it, so they can replace or remove \
         the metrics file; updraft creates its files there under random names and never opens one \
         it did not make",
        dir.display()
    ))
}

/// Writes families into a string.
struct Family<'a> {
    out: &'a mut String,
}

impl<'a> Family<'a> {
    fn new(out: &'a mut String) -> Family<'a> {
        Family { out }
    }

    fn header(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape_label(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }
}

/// Label values: backslash, double quote and line feed are escaped.
fn escape_label(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

/// HELP text: backslash and line feed are escaped.
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

#[cfg(test)]
mod shared_directory_tests {
    use super::*;

    #[test]
    fn a_directory_others_can_write_is_named_in_a_warning() {
        let dir = Path::new("/var/lib/prometheus/node-exporter");
        let rows: [(u32, u32, u32, Option<&str>); 7] = [
            (0o40755, 0, 0, None),
            (0o40700, 0, 0, None),
            (0o40755, 1000, 1000, None),
            (0o40775, 0, 0, Some("is mode 0775")),
            (0o41777, 0, 0, Some("is mode 1777")),
            (0o40755, 115, 0, Some("is owned by uid 115")),
            (0o40775, 115, 0, Some("is mode 0775 and owned by uid 115")),
        ];
        for (mode, owner, me, expected) in rows {
            let got = shared_directory_warning(dir, mode, owner, me);
            match expected {
                None => assert_eq!(got, None, "mode {mode:o} owner {owner} me {me}"),
                Some(part) => {
                    let w = got.unwrap_or_default();
                    assert!(
                        w.contains(part) && w.contains(dir.to_str().unwrap_or("")),
                        "{w}"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_listed_once_in_order() {
        for (i, k) in KINDS.iter().enumerate() {
            assert_eq!(kind_index(*k), i, "{}", k.as_str());
        }
    }

    #[test]
    fn fresh_metrics_expose_zeroed_counters_and_idle() {
        let text = Metrics::new().render();
        assert!(text.contains("updraft_checks_total 0\n"), "{text}");
        assert!(
            text.contains("updraft_errors_total{kind=\"network\"} 0\n"),
            "{text}"
        );
        assert!(text.contains("updraft_state{state=\"idle\"} 1\n"), "{text}");
        assert!(
            text.contains("updraft_state{state=\"testing\"} 0\n"),
            "{text}"
        );
        // Unknown facts are absent, not zero: a zero timestamp would read as 1970.
        assert!(
            !text.contains("updraft_last_check_timestamp_seconds"),
            "{text}"
        );
        assert!(!text.contains("updraft_booted_slot"), "{text}");
        assert!(!text.contains("updraft_release_info"), "{text}");
    }

    #[test]
    fn components_show_up_one_series_each_and_not_before_the_first() {
        let mut m = Metrics::new();
        assert!(!m.render().contains("updraft_component_info"));
        m.set_components(vec![
            ("web".into(), "app".into(), "1.4".into()),
            ("mcu".into(), "command".into(), "4.\"1".into()),
        ]);
        let text = m.render();
        assert!(
            text.contains(
                "updraft_component_info{component=\"web\",kind=\"app\",version=\"1.4\"} 1\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "updraft_component_info{component=\"mcu\",kind=\"command\",version=\"4.\\\"1\"} 1\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn updates_show_up_in_the_text() {
        let mut m = Metrics::new();
        m.record_check(Timestamp(1_796_040_000), true);
        m.record_check(Timestamp(1_796_041_800), false);
        m.record_error(Kind::Network);
        m.record_error(Kind::Network);
        m.record_signature_failure();
        m.add_downloaded(1000);
        m.add_downloaded(24);
        m.set_last_install_duration(Duration::from_millis(93_250));
        m.set_booted_slot(SlotName::B);
        m.set_release(SlotName::B, Some("2.0"));
        m.set_state("testing");
        m.set_outbox_depth(3);
        let text = m.render();
        for line in [
            "updraft_checks_total 2",
            "updraft_last_check_timestamp_seconds 1796041800",
            "updraft_last_successful_check_timestamp_seconds 1796040000",
            "updraft_errors_total{kind=\"network\"} 2",
            "updraft_signature_failures_total 1",
            "updraft_downloaded_bytes_total 1024",
            "updraft_last_install_duration_seconds 93.25",
            "updraft_booted_slot{slot=\"A\"} 0",
            "updraft_booted_slot{slot=\"B\"} 1",
            "updraft_release_info{slot=\"B\",version=\"2.0\"} 1",
            "updraft_state{state=\"testing\"} 1",
            "updraft_state{state=\"idle\"} 0",
            "updraft_outbox_depth 3",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }

    #[test]
    fn an_unlisted_state_is_still_exposed() {
        let mut m = Metrics::new();
        m.set_state("migrating");
        let text = m.render();
        assert!(
            text.contains("updraft_state{state=\"migrating\"} 1\n"),
            "{text}"
        );
        let others: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("updraft_state{") && !l.contains("migrating"))
            .collect();
        assert_eq!(others.len(), STATES.len());
        assert!(others.iter().all(|l| l.ends_with(" 0")), "{others:?}");
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label(r#"a"b\c"#), r#"a\"b\\c"#);
        assert_eq!(escape_label("x\ny"), "x\\ny");
        let mut m = Metrics::new();
        m.set_release(SlotName::A, Some("1.0 \"beta\"\nnext"));
        let text = m.render();
        assert!(
            text.contains(r#"updraft_release_info{slot="A",version="1.0 \"beta\"\nnext"} 1"#),
            "{text}"
        );
        assert_eq!(
            text.lines()
                .filter(|l| l.starts_with("updraft_release_info{"))
                .count(),
            1
        );
    }

    #[test]
    fn a_held_release_is_shown_since_when_it_waits() {
        let mut m = Metrics::new();
        assert!(!m.render().contains("updraft_held_since"));
        m.set_held_since(Some(Timestamp(1_796_000_000)));
        let text = m.render();
        assert!(
            text.contains("# TYPE updraft_held_since_timestamp_seconds gauge\n"),
            "{text}"
        );
        assert!(
            text.contains("\nupdraft_held_since_timestamp_seconds 1796000000\n"),
            "{text}"
        );
    }

    #[test]
    fn what_a_held_release_waits_for_is_a_state_set() {
        let mut m = Metrics::new();
        let text = m.render();
        for w in WAITS {
            assert!(
                text.contains(&format!("\nupdraft_waiting{{for=\"{w}\"}} 0\n")),
                "{text}"
            );
        }
        assert!(text.contains("\nupdraft_inhibitors 0\n"), "{text}");
        m.set_waiting(Some("inhibitor"), 2);
        let text = m.render();
        assert!(
            text.contains("\nupdraft_waiting{for=\"inhibitor\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("\nupdraft_waiting{for=\"window\"} 0\n"),
            "{text}"
        );
        assert!(text.contains("\nupdraft_inhibitors 2\n"), "{text}");
    }

    #[test]
    fn write_replaces_the_file() {
        let dir = std::env::temp_dir().join(format!("updraft-metrics-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("updraft.prom");
        let mut m = Metrics::new();
        m.write(&path).unwrap();
        m.set_outbox_depth(7);
        m.write(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("updraft_outbox_depth 7\n"));
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("updraft.prom")]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn write_names_the_path_on_failure() {
        let path = Path::new("/nonexistent-updraft-dir/updraft.prom");
        let e = Metrics::new().write(path).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("writing metrics to /nonexistent-updraft-dir/updraft.prom: "),
            "{e}"
        );
    }
}
