//! The process's logger: `log` records to stderr, one line per event.
//!
//! Under systemd, stderr is a stream into journald and systemd says so with
//! `JOURNAL_STREAM=<dev>:<inode>`. When that names the stderr we actually
//! have, each line starts with the sd-daemon(3) priority prefix (`<3>`
//! error, `<4>` warning, `<6>` info, `<7>` debug and trace) so `journalctl -p`
//! filters by level, and carries no timestamp because journald stamps every
//! entry itself. Anywhere else (a terminal, a test, a redirected file) a line
//! is `2026-11-30T12:00:00.123Z INFO  message`.
//!
//! The level comes from `UPDRAFT_LOG`: a level (`error`, `warn`, `info`,
//! `debug`, `trace`, `off`), optionally followed by per-module overrides,
//! e.g. `debug,rustls=info,ureq=warn`. Default `info`. A value that does not
//! parse falls back to the default and says so in the log.
//!
//! One event is one line: newlines and other control characters inside a
//! message (a server's error text, a release name) are escaped, so nothing a
//! remote party sends can forge a log line or a journal priority. This
//! module only formats and writes; it never decides what is worth logging.
//!
//! Under systemd the same entry goes to journald's native socket instead
//! ([`crate::journal`]) when it can, with structured fields: `PRIORITY`,
//! `SYSLOG_IDENTIFIER=updraft`, `CODE_FILE`/`CODE_LINE`, and for an event
//! logged through [`event`] `UPDRAFT_EVENT`, its `MESSAGE_ID` from
//! [`crate::events`] and `UPDRAFT_RELEASE`, `UPDRAFT_SLOT`,
//! `UPDRAFT_COMPONENT`, `UPDRAFT_REASON`. An entry the socket does not take
//! is written as the stderr line, so nothing is lost to a full journal.

use std::fmt::Write as _;
use std::io::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use log::kv::{self, VisitSource};
use log::{Level, LevelFilter, Log, Metadata, Record};

use crate::journal::Journal;
use crate::timestamp::Timestamp;

/// The environment variable holding the level specification.
pub const ENV: &str = "UPDRAFT_LOG";

/// Level used when `UPDRAFT_LOG` is unset or does not parse.
pub const DEFAULT_LEVEL: LevelFilter = LevelFilter::Info;

/// Install the logger. Call once, first thing in `main`; later calls (and
/// calls after another logger was installed, as in tests) change nothing.
pub fn init() {
    let spec = std::env::var(ENV).ok();
    let (filter, problem) = match spec.as_deref() {
        None => (Filter::default(), None),
        Some(s) => match Filter::parse(s) {
            Ok(f) => (f, None),
            Err(e) => (Filter::default(), Some(e)),
        },
    };
    let style = if journal_stream_is_stderr() {
        Style::Journal
    } else {
        Style::Terminal
    };
    let max = filter.max();
    let journal = match style {
        Style::Journal => Journal::connect(std::path::Path::new(crate::journal::SOCKET)).ok(),
        Style::Terminal => None,
    };
    let logger: &'static Logger = Box::leak(Box::new(Logger {
        filter,
        style,
        journal,
    }));
    if log::set_logger(logger).is_ok() {
        log::set_max_level(max);
        if let Some(e) = problem {
            log::warn!("{ENV}: {e}; logging at {DEFAULT_LEVEL}");
        }
    }
}

/// How lines are decorated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Style {
    /// `<N>message`: journald adds the time and keeps the priority.
    Journal,
    /// `TIME LEVEL message`.
    Terminal,
}

/// Which records pass: a default level and per-module overrides (the
/// longest matching module prefix wins).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Filter {
    default: LevelFilter,
    modules: Vec<(String, LevelFilter)>,
}

impl Default for Filter {
    fn default() -> Self {
        Filter {
            default: DEFAULT_LEVEL,
            modules: Vec::new(),
        }
    }
}

impl Filter {
    fn parse(spec: &str) -> Result<Filter, String> {
        let mut f = Filter::default();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part.split_once('=') {
                None => f.default = level(part)?,
                Some((module, lvl)) => {
                    let module = module.trim();
                    if module.is_empty()
                        || !module
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
                    {
                        return Err(format!("{module:?} is not a module path"));
                    }
                    f.modules.push((module.to_string(), level(lvl.trim())?));
                }
            }
        }
        Ok(f)
    }

    fn level_for(&self, target: &str) -> LevelFilter {
        self.modules
            .iter()
            .filter(|(m, _)| {
                target == m
                    || (target.starts_with(m.as_str()) && target[m.len()..].starts_with("::"))
            })
            .max_by_key(|(m, _)| m.len())
            .map_or(self.default, |(_, l)| *l)
    }

    fn max(&self) -> LevelFilter {
        self.modules
            .iter()
            .map(|(_, l)| *l)
            .fold(self.default, std::cmp::Ord::max)
    }
}

fn level(s: &str) -> Result<LevelFilter, String> {
    s.parse::<LevelFilter>()
        .map_err(|_| format!("{s:?} is not a level (off, error, warn, info, debug, trace)"))
}

struct Logger {
    filter: Filter,
    style: Style,
    /// journald's native socket, under systemd when it could be opened.
    journal: Option<Journal>,
}

/// What an event logged with [`event`] is about; each present value
/// becomes a journal field.
#[derive(Clone, Copy, Debug, Default)]
pub struct EventFields<'a> {
    /// A kind's name from [`crate::events::KINDS`].
    pub event: &'a str,
    pub release: Option<&'a str>,
    pub slot: Option<&'a str>,
    pub component: Option<&'a str>,
    pub reason: Option<&'a str>,
}

/// The target of events logged with [`event`] (`UPDRAFT_LOG=updraft::events=warn`
/// keeps only the events an operator must act on).
pub const EVENT_TARGET: &str = "updraft::events";

/// Log `message` at `level` as an event of the kind `fields.event`, its
/// fields attached for the journal. On a terminal the line is as
/// `log::log!` makes it.
pub fn event(level: Level, fields: &EventFields<'_>, message: std::fmt::Arguments<'_>) {
    let logger = log::logger();
    let meta = Metadata::builder()
        .level(level)
        .target(EVENT_TARGET)
        .build();
    if level > log::max_level() || !logger.enabled(&meta) {
        return;
    }
    let mut kvs: Vec<(&str, &str)> = vec![("event", fields.event)];
    for (k, v) in [
        ("release", fields.release),
        ("slot", fields.slot),
        ("component", fields.component),
        ("reason", fields.reason),
    ] {
        if let Some(v) = v {
            kvs.push((k, v));
        }
    }
    logger.log(
        &Record::builder()
            .args(message)
            .level(level)
            .target(EVENT_TARGET)
            .key_values(&kvs.as_slice())
            .build(),
    );
}

/// The most of one field's value sent to the journal.
const FIELD_MAX: usize = 4096;

/// The journal fields of `record` (its message as the stderr line has it,
/// without priority or time).
fn journal_fields(record: &Record) -> Vec<(String, String)> {
    let mut fields = vec![
        ("MESSAGE".to_string(), message_text(record)),
        ("PRIORITY".to_string(), priority(record.level()).to_string()),
        ("SYSLOG_IDENTIFIER".to_string(), "updraft".to_string()),
    ];
    if let Some(file) = record.file() {
        fields.push(("CODE_FILE".into(), file.to_string()));
    }
    if let Some(line) = record.line() {
        fields.push(("CODE_LINE".into(), line.to_string()));
    }
    struct Collect<'f>(&'f mut Vec<(String, String)>);
    impl<'kvs> VisitSource<'kvs> for Collect<'_> {
        fn visit_pair(
            &mut self,
            key: kv::Key<'kvs>,
            value: kv::Value<'kvs>,
        ) -> Result<(), kv::Error> {
            let key = key.as_str();
            if !key.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
                return Ok(());
            }
            let value = value.to_string();
            let value = crate::hash::truncate(&value, FIELD_MAX).to_string();
            if key == "event" {
                if let Some(kind) = crate::events::kind(&value) {
                    self.0
                        .push(("MESSAGE_ID".into(), kind.message_id.to_string()));
                }
            }
            self.0
                .push((format!("UPDRAFT_{}", key.to_ascii_uppercase()), value));
            Ok(())
        }
    }
    let _ = record.key_values().visit(&mut Collect(&mut fields));
    fields
}

impl Log for Logger {
    fn enabled(&self, metadata: &Metadata) -> bool {
        metadata.level() <= self.filter.level_for(metadata.target())
    }

    fn log(&self, record: &Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        if let Some(journal) = &self.journal {
            let fields = journal_fields(record);
            let refs: Vec<(&str, &str)> = fields
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            if journal.send(&refs).is_ok() {
                return;
            }
        }
        let line = format_line(self.style, record, now_millis());
        // One write per line: stderr is unbuffered, so concurrent lines do
        // not interleave mid-line. A failing stderr has nowhere to report to.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }

    fn flush(&self) {
        let _ = std::io::stderr().flush();
    }
}

fn now_millis() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

/// sd-daemon(3) priorities.
fn priority(level: Level) -> u8 {
    match level {
        Level::Error => 3,
        Level::Warn => 4,
        Level::Info => 6,
        Level::Debug | Level::Trace => 7,
    }
}

/// One complete line, newline included. `now_ms`: Unix time in milliseconds.
fn format_line(style: Style, record: &Record, now_ms: u128) -> String {
    let mut line = String::with_capacity(128);
    match style {
        Style::Journal => {
            let _ = write!(line, "<{}>", priority(record.level()));
        }
        Style::Terminal => {
            let secs = i64::try_from(now_ms / 1000).unwrap_or(i64::MAX);
            let stamp = Timestamp(secs).to_rfc3339();
            let stamp = stamp.strip_suffix('Z').unwrap_or(&stamp);
            let _ = write!(line, "{stamp}.{:03}Z {:<5} ", now_ms % 1000, record.level());
        }
    }
    line.push_str(&message_text(record));
    line.push('\n');
    line
}

/// The message as a line shows it: `[module] ` for a dependency's records
/// (updraft's own read as plain sentences), control characters escaped.
fn message_text(record: &Record) -> String {
    let mut text = String::with_capacity(96);
    let target = record.target();
    if target != "updraft" && !target.starts_with("updraft::") {
        text.push('[');
        push_escaped(&mut text, target);
        text.push_str("] ");
    }
    push_escaped(&mut text, &record.args().to_string());
    text
}

/// Append `s` with control characters made visible: `\n`, `\r`, `\t` as
/// backslash escapes and the rest as `\x1b`, so a message stays one line and
/// cannot carry terminal escape sequences.
fn push_escaped(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
}

/// True when `JOURNAL_STREAM` names the file stderr is connected to (a
/// stderr redirected by a parent, e.g. `updraft status 2>file` run from a
/// unit, must get plain lines).
fn journal_stream_is_stderr() -> bool {
    let Some(var) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some(var) = var.to_str() else {
        return false;
    };
    // Through std's metadata (statx or fstat64) on a duplicate of the
    // descriptor: glibc's 32-bit fstat on armv7 fails with EOVERFLOW for an
    // inode number above 2^32.
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    let meta = std::io::stderr()
        .as_fd()
        .try_clone_to_owned()
        .map(std::fs::File::from)
        .and_then(|f| f.metadata());
    match meta {
        Ok(m) => journal_stream_matches(var, m.dev(), m.ino()),
        Err(_) => false,
    }
}

/// `JOURNAL_STREAM` is `<device>:<inode>` in decimal.
fn journal_stream_matches(var: &str, dev: u64, ino: u64) -> bool {
    let Some((d, i)) = var.trim().split_once(':') else {
        return false;
    };
    d.parse::<u64>() == Ok(dev) && i.parse::<u64>() == Ok(ino)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(style: Style, level: Level, target: &str, msg: &str) -> String {
        // 2026-11-30T12:00:00.042Z
        format_line(
            style,
            &Record::builder()
                .level(level)
                .target(target)
                .args(format_args!("{msg}"))
                .build(),
            1_796_040_000_042,
        )
    }

    #[test]
    fn journal_lines_carry_the_priority_and_no_timestamp() {
        assert_eq!(
            line(Style::Journal, Level::Error, "updraft::daemon", "boom"),
            "<3>boom\n"
        );
        assert_eq!(
            line(Style::Journal, Level::Warn, "updraft", "hm"),
            "<4>hm\n"
        );
        assert_eq!(
            line(Style::Journal, Level::Info, "updraft::slot", "ok"),
            "<6>ok\n"
        );
        assert_eq!(line(Style::Journal, Level::Debug, "updraft", "d"), "<7>d\n");
        assert_eq!(line(Style::Journal, Level::Trace, "updraft", "t"), "<7>t\n");
    }

    #[test]
    fn terminal_lines_carry_time_and_level() {
        assert_eq!(
            line(Style::Terminal, Level::Info, "updraft::daemon", "idle"),
            "2026-11-30T12:00:00.042Z INFO  idle\n"
        );
        assert_eq!(
            line(Style::Terminal, Level::Error, "updraft", "bad"),
            "2026-11-30T12:00:00.042Z ERROR bad\n"
        );
    }

    #[test]
    fn dependency_records_name_their_module() {
        assert_eq!(
            line(
                Style::Journal,
                Level::Warn,
                "rustls::client",
                "sent fatal alert"
            ),
            "<4>[rustls::client] sent fatal alert\n"
        );
        // A crate whose name merely starts with "updraft" is not ours.
        assert_eq!(
            line(Style::Journal, Level::Info, "updrafter", "x"),
            "<6>[updrafter] x\n"
        );
    }

    #[test]
    fn a_message_cannot_forge_another_line_or_priority() {
        let forged = line(
            Style::Journal,
            Level::Info,
            "updraft",
            "server said: 404\n<3>root compromised\x1b[2J",
        );
        assert_eq!(
            forged,
            "<6>server said: 404\\n<3>root compromised\\x1b[2J\n"
        );
        assert_eq!(forged.matches('\n').count(), 1);
    }

    #[test]
    fn level_spec_parses_default_and_module_overrides() {
        let f = Filter::parse("debug,rustls=warn,updraft::fetch=trace").unwrap();
        assert_eq!(f.level_for("updraft::daemon"), LevelFilter::Debug);
        assert_eq!(f.level_for("rustls::conn"), LevelFilter::Warn);
        assert_eq!(f.level_for("rustls"), LevelFilter::Warn);
        assert_eq!(f.level_for("rustlsx"), LevelFilter::Debug);
        assert_eq!(f.level_for("updraft::fetch::range"), LevelFilter::Trace);
        assert_eq!(f.max(), LevelFilter::Trace);
        assert_eq!(Filter::parse("").unwrap(), Filter::default());
        assert_eq!(Filter::parse("WARN").unwrap().default, LevelFilter::Warn);
        assert_eq!(Filter::parse("off").unwrap().max(), LevelFilter::Off);
    }

    #[test]
    fn a_bad_level_spec_is_reported() {
        assert!(Filter::parse("loud").unwrap_err().contains("\"loud\""));
        assert!(Filter::parse("info,=debug").is_err());
        assert!(Filter::parse("info,a b=debug").is_err());
    }

    #[test]
    fn default_level_is_info() {
        let logger = Logger {
            filter: Filter::default(),
            style: Style::Journal,
            journal: None,
        };
        let meta = |level| Metadata::builder().level(level).target("updraft").build();
        assert!(logger.enabled(&meta(Level::Info)));
        assert!(logger.enabled(&meta(Level::Warn)));
        assert!(!logger.enabled(&meta(Level::Debug)));
    }

    #[test]
    fn journal_stream_must_name_this_stderr() {
        assert!(journal_stream_matches("8:12345", 8, 12345));
        assert!(!journal_stream_matches("8:12345", 8, 12346));
        assert!(!journal_stream_matches("8", 8, 12345));
        assert!(!journal_stream_matches("x:y", 8, 12345));
        assert!(!journal_stream_matches("", 0, 0));
    }

    fn fields_of(record: &Record) -> Vec<(String, String)> {
        journal_fields(record)
            .into_iter()
            .filter(|(k, _)| k != "CODE_FILE" && k != "CODE_LINE")
            .collect()
    }

    fn pairs(rows: &[(&str, &str)]) -> Vec<(String, String)> {
        rows.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn an_event_carries_its_message_id_and_what_it_is_about() {
        let kvs = [
            ("event", "committed"),
            ("release", "1.2"),
            ("slot", "B"),
            ("reason", "health checks passed"),
        ];
        let source = kvs.as_slice();
        let record = Record::builder()
            .level(Level::Info)
            .target(EVENT_TARGET)
            .args(format_args!("committed: release 1.2 slot B"))
            .key_values(&source)
            .build();
        assert_eq!(
            fields_of(&record),
            pairs(&[
                ("MESSAGE", "committed: release 1.2 slot B"),
                ("PRIORITY", "6"),
                ("SYSLOG_IDENTIFIER", "updraft"),
                ("MESSAGE_ID", "304d0bcac2744e2e8adc8929fd0b186e"),
                ("UPDRAFT_EVENT", "committed"),
                ("UPDRAFT_RELEASE", "1.2"),
                ("UPDRAFT_SLOT", "B"),
                ("UPDRAFT_REASON", "health checks passed"),
            ])
        );
    }

    #[test]
    fn plain_records_unknown_kinds_and_odd_keys_get_no_message_id() {
        let plain = Record::builder()
            .level(Level::Warn)
            .target("ureq::pool")
            .args(format_args!("line\nbreak"))
            .build();
        assert_eq!(
            fields_of(&plain),
            pairs(&[
                ("MESSAGE", "[ureq::pool] line\\nbreak"),
                ("PRIORITY", "4"),
                ("SYSLOG_IDENTIFIER", "updraft"),
            ])
        );
        let kvs = [("event", "no-such-kind"), ("Bad Key", "x")];
        let source = kvs.as_slice();
        let unknown = Record::builder()
            .level(Level::Error)
            .target(EVENT_TARGET)
            .args(format_args!("m"))
            .key_values(&source)
            .build();
        assert_eq!(
            fields_of(&unknown),
            pairs(&[
                ("MESSAGE", "m"),
                ("PRIORITY", "3"),
                ("SYSLOG_IDENTIFIER", "updraft"),
                ("UPDRAFT_EVENT", "no-such-kind"),
            ])
        );
    }

    #[test]
    fn a_long_reason_is_cut_for_the_journal_and_every_field_name_is_valid() {
        let long = "x".repeat(10_000);
        let kvs = [("event", "failed"), ("reason", long.as_str())];
        let source = kvs.as_slice();
        let record = Record::builder()
            .level(Level::Warn)
            .target(EVENT_TARGET)
            .args(format_args!("failed"))
            .key_values(&source)
            .line(Some(42))
            .file(Some("agent/src/machine/mod.rs"))
            .build();
        let fields = journal_fields(&record);
        let reason = fields.iter().find(|(k, _)| k == "UPDRAFT_REASON");
        assert_eq!(reason.map(|(_, v)| v.len()), Some(FIELD_MAX));
        assert!(fields.contains(&("CODE_LINE".into(), "42".into())));
        for (k, _) in &fields {
            assert!(crate::journal::valid_name(k), "{k}");
        }
    }
}
