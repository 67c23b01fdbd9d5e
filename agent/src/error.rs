//! One error type for the whole agent.
//!
//! Every failure an operator can see ends up as an [`Error`]: a [`Kind`] that
//! code branches on (retry the network, wait for the clock, give up on a
//! release) and a message that reads as one sentence with its context, e.g.
//! `manifest serial 41 is older than stored serial 42`. Context is added on
//! the way up with [`Context::context`], outermost first, so the log line
//! says what was being done and then why it failed.
//!
//! Where the kind is too coarse for a decision, an error carries a
//! [`Cause`], set where the fact is known (an I/O or SQLite error code, the
//! download deadline); nothing branches on a message's text.
//!
//! This module must stay free of policy: it never decides whether a failure
//! is retried; callers ask [`Error::kind`] and [`Error::cause`].

use std::fmt;

/// What went wrong, coarsely: enough to choose a reaction and to count errors
/// by kind in the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// The configuration file is missing, malformed or inconsistent.
    Config,
    /// A command line that cannot be understood.
    Usage,
    /// Signatures, thresholds or key documents do not verify.
    Signature,
    /// The manifest is well signed but must not be acted on (rollback,
    /// expired, incompatible, unsupported version).
    Policy,
    /// Bytes are not what the signed metadata says (hashes, sizes, frames).
    Integrity,
    /// Untrusted input is malformed (JSON, base64, zstd, delta, environment).
    Malformed,
    /// The system clock cannot be trusted yet.
    Clock,
    /// The network or the server failed; worth retrying later.
    Network,
    /// A slot cannot be used as asked (booted, mounted, too small).
    Slot,
    /// The bootloader environment cannot be read or written safely.
    Bootloader,
    /// The persistent store failed.
    Store,
    /// Another updraft process holds the lock, or the daemon is busy.
    Busy,
    /// A local I/O failure not covered above.
    Io,
    /// A health check failed or timed out.
    Health,
    /// The operation was interrupted on purpose (SIGTERM, operator).
    Stopped,
    /// The caller may not do this (control socket permissions).
    Denied,
    /// The daemon could not start and runs degraded: it answers, feeds the
    /// watchdog and retries its start, but updates nothing.
    Degraded,
}

impl Kind {
    /// Stable lower-case name, used in metrics labels and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Config => "config",
            Kind::Usage => "usage",
            Kind::Signature => "signature",
            Kind::Policy => "policy",
            Kind::Integrity => "integrity",
            Kind::Malformed => "malformed",
            Kind::Clock => "clock",
            Kind::Network => "network",
            Kind::Slot => "slot",
            Kind::Bootloader => "bootloader",
            Kind::Store => "store",
            Kind::Busy => "busy",
            Kind::Io => "io",
            Kind::Health => "health",
            Kind::Stopped => "stopped",
            Kind::Denied => "denied",
            Kind::Degraded => "degraded",
        }
    }
}

/// A fact about a failure, finer than its [`Kind`], that a decision needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// A write found its filesystem full (SQLite's `SQLITE_FULL`,
    /// `ENOSPC`): what to free is named where the path is known.
    NoSpace,
    /// SQLite found the file damaged: not a database, or malformed.
    Damaged,
    /// A download ran past its job's deadline: it is not tried again within
    /// the job.
    Deadline,
}

/// An error with its kind and a human-readable chain of context.
#[derive(Debug)]
pub struct Error {
    kind: Kind,
    message: String,
    /// A server asked to be left alone for this long (429/503 Retry-After).
    retry_after: Option<std::time::Duration>,
    cause: Option<Cause>,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(kind: Kind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            retry_after: None,
            cause: None,
        }
    }

    /// The same error, known to have come from `cause`.
    pub fn with_cause(mut self, cause: Cause) -> Self {
        self.cause = Some(cause);
        self
    }

    /// What is known of the failure beyond its kind.
    pub fn cause(&self) -> Option<Cause> {
        self.cause
    }

    /// Whether a write found its filesystem full.
    pub fn no_space(&self) -> bool {
        self.cause == Some(Cause::NoSpace)
    }

    /// Attach the delay a server asked for before the next attempt.
    pub fn with_retry_after(mut self, d: std::time::Duration) -> Self {
        self.retry_after = Some(d);
        self
    }

    /// The delay a server asked for, if any.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        self.retry_after
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    /// Prefix the message with what was being done.
    pub fn wrap(mut self, context: impl fmt::Display) -> Self {
        self.message = format!("{context}: {}", self.message);
        self
    }

    /// Add what follows from the failure after the message
    /// ("…; the download deadline … has passed: not retried").
    pub fn append(mut self, consequence: impl fmt::Display) -> Self {
        self.message = format!("{}; {consequence}", self.message);
        self
    }

    /// The same error with another kind (e.g. an I/O error while reading a
    /// slot is a slot problem, not a generic one).
    pub fn with_kind(mut self, kind: Kind) -> Self {
        self.kind = kind;
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        let out = Error::new(Kind::Io, e.to_string());
        match e.kind() {
            std::io::ErrorKind::StorageFull => out.with_cause(Cause::NoSpace),
            _ => out,
        }
    }
}

impl From<nix::Error> for Error {
    fn from(e: nix::Error) -> Self {
        Error::new(Kind::Io, e.desc())
    }
}

impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Self {
        let out = Error::new(Kind::Store, e.to_string());
        match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::DiskFull) => out.with_cause(Cause::NoSpace),
            Some(rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase) => {
                out.with_cause(Cause::Damaged)
            }
            _ => out,
        }
    }
}

/// Shorthand constructors, so call sites read `bail!(Integrity, "...")`.
#[macro_export]
macro_rules! err {
    ($kind:ident, $($arg:tt)*) => {
        $crate::error::Error::new($crate::error::Kind::$kind, format!($($arg)*))
    };
}

/// Return early with an error of the given kind.
#[macro_export]
macro_rules! bail {
    ($kind:ident, $($arg:tt)*) => {
        return Err($crate::err!($kind, $($arg)*))
    };
}

/// Attach context to any fallible result whose error converts into [`Error`].
pub trait Context<T> {
    /// Prefix the error message with `context`.
    fn context(self, context: impl fmt::Display) -> Result<T>;
    /// Prefix lazily, for contexts that cost a `format!`.
    fn with_context<D: fmt::Display, F: FnOnce() -> D>(self, f: F) -> Result<T>;
    /// Prefix and re-classify.
    fn kind_context(self, kind: Kind, context: impl fmt::Display) -> Result<T>;
}

impl<T, E: Into<Error>> Context<T> for std::result::Result<T, E> {
    fn context(self, context: impl fmt::Display) -> Result<T> {
        self.map_err(|e| e.into().wrap(context))
    }

    fn with_context<D: fmt::Display, F: FnOnce() -> D>(self, f: F) -> Result<T> {
        self.map_err(|e| e.into().wrap(f()))
    }

    fn kind_context(self, kind: Kind, context: impl fmt::Display) -> Result<T> {
        self.map_err(|e| e.into().wrap(context).with_kind(kind))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_reads_outermost_first() {
        let r: std::result::Result<(), std::io::Error> = Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "permission denied",
        ));
        let e = r
            .context("opening slot B")
            .map_err(|e| e.wrap("installing 2.0"))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "installing 2.0: opening slot B: permission denied"
        );
        assert_eq!(e.kind(), Kind::Io);
    }

    #[test]
    fn kind_context_reclassifies() {
        let r: Result<()> = Err(err!(Io, "short read"));
        let e = r.kind_context(Kind::Slot, "reading slot A").unwrap_err();
        assert_eq!(e.kind(), Kind::Slot);
        assert_eq!(e.message(), "reading slot A: short read");
    }
}
