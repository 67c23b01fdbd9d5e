//! Persistent state in SQLite: the state machine, trust, history, the
//! report outbox.
//!
//! One database file, `state_dir/updraft.db`, on a partition both slots
//! share. Every write is a transaction in rollback-journal mode with
//! `synchronous=EXTRA` (FULL, plus a directory sync after the journal is
//! deleted, which is the commit point), the most conservative combination
//! and one that works on any filesystem. After a power cut the database
//! holds exactly the transactions that returned. A state transition, its history line and its
//! report are one transaction: a report can never be lost or invented
//! relative to the state it describes.
//!
//! The schema only ever grows (new tables, new nullable columns), so an older
//! updraft booted after a rollback still reads the database a newer one
//! wrote. This module stores and returns values; it makes no decisions
//! beyond refusing an illegal state transition.

use std::path::Path;

use rusqlite::{Connection, OpenFlags, OptionalExtension, params};
use serde::{Deserialize, Serialize};

use crate::error::{Cause, Context, Error, Kind, Result};
use crate::hash::Sha256;
use crate::slot::SlotName;
use crate::state::State;
use crate::timestamp::Timestamp;
use crate::{bail, err};

pub mod component;
mod outbox;

pub use component::Running;

/// Current schema version; migrations below bring older files up to it.
const SCHEMA_VERSION: i64 = 1;

const SCHEMA_V1: &str = "
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS state (
    id    INTEGER PRIMARY KEY CHECK (id = 1),
    body  TEXT NOT NULL,
    since INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS key_documents (
    version  INTEGER PRIMARY KEY,
    envelope BLOB NOT NULL,
    accepted INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS slots (
    name      TEXT PRIMARY KEY,
    version   TEXT NOT NULL,
    sha256    TEXT NOT NULL,
    size      INTEGER NOT NULL,
    installed INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS rejected (
    sha256  TEXT PRIMARY KEY,
    version TEXT NOT NULL,
    reason  TEXT NOT NULL,
    time    INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS history (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    time    INTEGER NOT NULL,
    event   TEXT NOT NULL,
    release TEXT,
    slot    TEXT,
    detail  TEXT
);
CREATE TABLE IF NOT EXISTS outbox (
    seq      INTEGER PRIMARY KEY AUTOINCREMENT,
    key      TEXT NOT NULL UNIQUE,
    kind     TEXT NOT NULL,
    created  INTEGER NOT NULL,
    updated  INTEGER NOT NULL,
    count    INTEGER NOT NULL DEFAULT 1,
    foldable INTEGER NOT NULL DEFAULT 0,
    body     TEXT NOT NULL
);
";

/// The `meta` key of what a download left on `slot` ([`Store::partial_write`]).
fn partial_key(slot: SlotName) -> String {
    format!("partial.{}", slot.as_str())
}

/// History entries kept; older ones are pruned.
const HISTORY_KEEP: i64 = 1000;

/// What a slot is known to hold (written after its image verified).
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct SlotRecord {
    pub slot: SlotName,
    pub version: String,
    pub sha256: Sha256,
    pub size: u64,
    pub installed: Timestamp,
}

/// One line of history.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct HistoryEntry {
    pub id: i64,
    pub time: Timestamp,
    pub event: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub release: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slot: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// A history line to write with a transition.
#[derive(Clone, Debug, Default)]
pub struct Event<'a> {
    pub event: &'a str,
    pub release: Option<&'a str>,
    pub slot: Option<SlotName>,
    pub detail: Option<&'a str>,
}

/// One queued row as the bound sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queued {
    pub seq: i64,
    pub kind: String,
    pub bytes: u64,
}

/// A report waiting in the outbox.
#[derive(Clone, Debug, PartialEq)]
pub struct OutboxEntry {
    pub seq: i64,
    pub key: String,
    pub kind: String,
    pub created: Timestamp,
    pub updated: Timestamp,
    pub count: i64,
    pub body: String,
    /// The report counter allocated when the row was queued; `None` for
    /// rows an older updraft queued.
    pub counter: Option<u64>,
}

/// A report to queue.
#[derive(Clone, Debug)]
pub struct Report<'a> {
    pub key: &'a str,
    pub kind: &'a str,
    /// Heartbeats and repeated poll failures: folded into the newest queued
    /// report of the same kind instead of adding a row.
    pub foldable: bool,
    pub body: &'a str,
}

pub struct Store {
    conn: Connection,
}

/// What must outlive the database file ([`crate::protect`] keeps a copy of
/// it beside the database): the serial floors, the all-time serial and the
/// clock floor, the operator's channel, the key documents accepted, the
/// images rejected and what each slot holds. As raw values: restoring
/// them makes the database say what it said.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct Protected {
    /// `meta` rows: every `floor.<channel>`, `serial`, `serial_epoch`,
    /// `time_floor`, `channel`.
    pub meta: std::collections::BTreeMap<String, String>,
    /// (version, envelope in base64)
    pub key_documents: Vec<(u64, String)>,
    /// (sha256, version, reason, time)
    pub rejected: Vec<(String, String, String, i64)>,
    /// (slot, version, sha256, size, installed)
    pub slots: Vec<(String, String, String, u64, i64)>,
}

/// The `meta` keys [`Protected`] keeps.
fn protected_meta(key: &str) -> bool {
    key.starts_with("floor.") || matches!(key, "serial" | "serial_epoch" | "time_floor" | "channel")
}

/// Whether SQLite found the file damaged (its error code, kept as the
/// error's cause when converted).
fn says_damaged(e: &Error) -> bool {
    e.cause() == Some(Cause::Damaged)
}

/// A database file found on open.
pub enum Opened {
    /// Usable: it opened, passed SQLite's `quick_check` and has the schema.
    Usable(Store),
    /// It cannot be used as it is: why, in SQLite's words.
    Damaged(String),
}

impl Store {
    /// Open (creating if needed) the database read-write.
    pub fn open(path: &Path) -> Result<Store> {
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .with_context(|| format!("opening database {}", path.display()))?;
        let store = Store { conn };
        store.configure()?;
        store
            .migrate()
            .with_context(|| format!("preparing database {}", path.display()))?;
        Ok(store)
    }

    /// Open the daemon's database, telling a damaged file (not a database,
    /// malformed, failing SQLite's `quick_check`) from other failures,
    /// which are errors. `quick_check` reads every page of a file of at
    /// most a few hundred kilobytes: milliseconds at each start.
    pub fn open_checked(path: &Path) -> Result<Opened> {
        let conn = match Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(Error::from)
        {
            Ok(c) => c,
            Err(e) if says_damaged(&e) => return Ok(Opened::Damaged(e.to_string())),
            Err(e) => return Err(e.wrap(format!("opening database {}", path.display()))),
        };
        let store = Store { conn };
        let checked = store.configure().and_then(|()| {
            let mut stmt = store.conn.prepare("PRAGMA quick_check")?;
            let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
            rows.collect::<std::result::Result<Vec<_>, _>>()
                .map_err(Error::from)
        });
        match checked {
            Ok(rows) if rows == ["ok"] => {}
            Ok(rows) => return Ok(Opened::Damaged(rows.join("; "))),
            Err(e) if says_damaged(&e) => return Ok(Opened::Damaged(e.to_string())),
            Err(e) => return Err(e.wrap(format!("opening database {}", path.display()))),
        }
        match store.migrate() {
            Ok(()) => Ok(Opened::Usable(store)),
            Err(e) if says_damaged(&e) => Ok(Opened::Damaged(e.to_string())),
            Err(e) => Err(e.wrap(format!("preparing database {}", path.display()))),
        }
    }

    /// Whether the database holds nothing yet: no state, no floor, no key
    /// document, no slot record (a file just made, or one that was empty).
    pub fn is_blank(&self) -> Result<bool> {
        let n: i64 = self.conn.query_row(
            "SELECT (SELECT COUNT(*) FROM state) + (SELECT COUNT(*) FROM slots)
                  + (SELECT COUNT(*) FROM key_documents) + (SELECT COUNT(*) FROM rejected)
                  + (SELECT COUNT(*) FROM meta WHERE key <> 'schema_version')",
            [],
            |r| r.get(0),
        )?;
        Ok(n == 0)
    }

    /// What must outlive this file ([`Protected`]).
    pub fn protected(&self) -> Result<Protected> {
        let mut p = Protected::default();
        let mut stmt = self
            .conn
            .prepare("SELECT key, value FROM meta ORDER BY key")?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
        for row in rows {
            let (k, v) = row?;
            if protected_meta(&k) {
                p.meta.insert(k, v);
            }
        }
        p.key_documents = self
            .key_documents()?
            .into_iter()
            .map(|(v, raw)| (v, crate::keys::encode_base64(&raw)))
            .collect();
        let mut stmt = self
            .conn
            .prepare("SELECT sha256, version, reason, time FROM rejected ORDER BY sha256")?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?;
        p.rejected = rows.collect::<std::result::Result<Vec<_>, _>>()?;
        let mut stmt = self
            .conn
            .prepare("SELECT name, version, sha256, size, installed FROM slots ORDER BY name")?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get::<_, i64>(3)?.max(0) as u64,
                r.get(4)?,
            ))
        })?;
        p.slots = rows.collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(p)
    }

    /// Read everything the daemon reads to start (the state, the slot
    /// records, the floors) and fail if any of it does not parse: a flipped
    /// byte inside a value is no damage to SQLite.
    pub fn validate(&self) -> Result<()> {
        self.state()?;
        for slot in [SlotName::A, SlotName::B] {
            self.slot_record(slot)?;
        }
        self.serial()?;
        self.time_floor()?;
        let mut stmt = self
            .conn
            .prepare("SELECT key FROM meta WHERE key LIKE 'floor.%'")?;
        let keys = stmt
            .query_map([], |r| r.get::<_, String>(0))?
            .collect::<std::result::Result<Vec<_>, _>>()?;
        for k in keys {
            if let Some(channel) = k.strip_prefix("floor.") {
                self.channel_floor(channel)?;
            }
        }
        Ok(())
    }

    /// Merge `p` into this database, in one transaction, without undoing
    /// anything newer the database holds: floors (`serial`, `time_floor`,
    /// each `floor.<channel>` within its epoch) are only raised; the
    /// channel, key documents, rejected images and slot records are added
    /// where the database has none. Safe at every start: a copy that is
    /// older than the database (a power cut between the two writes) changes
    /// nothing, a floor a flipped byte lowered is raised back.
    pub fn restore(&self, p: &Protected) -> Result<()> {
        self.atomically(|s| {
            for (k, v) in &p.meta {
                if !protected_meta(k) {
                    continue;
                }
                let keep_ours = match (k.as_str(), s.get(k)?) {
                    (_, None) => false,
                    // The operator's channel choice is the database's.
                    ("channel" | "serial_epoch", Some(_)) => true,
                    ("serial" | "time_floor", Some(ours)) => {
                        ours.parse::<i64>().ok() >= v.parse::<i64>().ok()
                    }
                    (f, Some(ours)) if f.starts_with("floor.") => {
                        let parse = |t: &str| {
                            t.split_once(' ')
                                .and_then(|(e, n)| Some((e.parse::<u64>().ok()?, n.parse::<u64>().ok()?)))
                        };
                        parse(&ours) >= parse(v)
                    }
                    _ => false,
                };
                if !keep_ours {
                    s.set(k, v)?;
                }
            }
            let have: Vec<u64> = s.key_documents()?.into_iter().map(|(v, _)| v).collect();
            for (version, b64) in &p.key_documents {
                if !have.contains(version) {
                    let raw = crate::keys::decode_base64(b64, "a protected key document")?;
                    s.put_key_document(*version, &raw)?;
                }
            }
            for (sha, version, reason, time) in &p.rejected {
                s.conn.execute(
                    "INSERT OR IGNORE INTO rejected (sha256, version, reason, time) VALUES (?1, ?2, ?3, ?4)",
                    params![sha, version, reason, time],
                )?;
            }
            for (name, version, sha, size, installed) in &p.slots {
                s.conn.execute(
                    "INSERT OR IGNORE INTO slots (name, version, sha256, size, installed) VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![name, version, sha, *size as i64, installed],
                )?;
            }
            Ok(())
        })
    }

    /// Open an existing database to read it (status and history without a
    /// daemon). When this process may write the file, it is opened
    /// read-write so that a transaction interrupted by a power cut (a hot
    /// journal) is rolled back as SQLite requires before reading; otherwise
    /// read-only.
    pub fn open_for_reading(path: &Path) -> Result<Store> {
        if !path.exists() {
            bail!(
                Store,
                "no database at {} (nothing installed yet?)",
                path.display()
            );
        }
        let writable = nix::unistd::access(path, nix::unistd::AccessFlags::W_OK).is_ok()
            && path
                .parent()
                .is_some_and(|d| nix::unistd::access(d, nix::unistd::AccessFlags::W_OK).is_ok());
        if writable {
            Store::open(path)
        } else {
            Store::open_readonly(path)
        }
    }

    /// Open an existing database for reading only.
    pub fn open_readonly(path: &Path) -> Result<Store> {
        if !path.exists() {
            bail!(
                Store,
                "no database at {} (nothing installed yet?)",
                path.display()
            );
        }
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .with_context(|| format!("opening database {}", path.display()))?;
        conn.busy_timeout(std::time::Duration::from_secs(2))?;
        Ok(Store { conn })
    }

    fn configure(&self) -> Result<()> {
        self.conn.busy_timeout(std::time::Duration::from_secs(5))?;
        // Rollback journal with synchronous=EXTRA: like FULL, and the
        // directory is also synced after the journal is unlinked, so a
        // commit is durable when it returns, on any filesystem (no
        // shared-memory WAL index needed).
        self.conn.pragma_update(None, "journal_mode", "DELETE")?;
        self.conn.pragma_update(None, "synchronous", "EXTRA")?;
        self.conn.pragma_update(None, "foreign_keys", "ON")?;
        // A small page cache keeps the daemon's resident memory low.
        self.conn.pragma_update(None, "cache_size", -128)?;
        Ok(())
    }

    /// Free the page cache and other memory SQLite holds but does not
    /// need until the next statement (the idle daemon calls this before it
    /// sleeps).
    pub fn shrink_memory(&self) -> Result<()> {
        self.conn.execute_batch("PRAGMA shrink_memory")?;
        Ok(())
    }

    /// Create or upgrade the schema, in one `IMMEDIATE` transaction: two
    /// processes opening a new database at once (the daemon starting and
    /// an `updraft status` beside it) must not both find it empty and both
    /// write its version.
    fn migrate(&self) -> Result<()> {
        // Rolled back when dropped uncommitted, as the other transactions
        // here are; IMMEDIATE takes the write lock before the first read.
        let tx = rusqlite::Transaction::new_unchecked(
            &self.conn,
            rusqlite::TransactionBehavior::Immediate,
        )?;
        self.conn.execute_batch(SCHEMA_V1)?;
        let version: Option<String> = self
            .conn
            .query_row(
                "SELECT value FROM meta WHERE key = 'schema_version'",
                [],
                |r| r.get(0),
            )
            .optional()?;
        match version.as_deref().map(str::parse::<i64>) {
            None => {
                self.conn.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema_version', ?1)",
                    params![SCHEMA_VERSION.to_string()],
                )?;
            }
            Some(Ok(v)) if v <= SCHEMA_VERSION => {
                // Additive migrations for v < SCHEMA_VERSION go here.
            }
            Some(Ok(v)) => {
                // Written by a newer updraft: still readable, since schemas
                // only grow. Leave the version as it is.
                log::info!(
                    "database schema {v} is newer than this updraft's {SCHEMA_VERSION}; continuing"
                );
            }
            Some(Err(_)) => bail!(Store, "database meta schema_version is not a number"),
        }
        // The report counter of each outbox row (nullable: an older
        // updraft inserts rows without it). Added to version 1 files
        // in place, as the schema only grows.
        let has_counter = {
            let mut stmt = self.conn.prepare("PRAGMA table_info(outbox)")?;
            let names = stmt.query_map([], |r| r.get::<_, String>(1))?;
            names
                .collect::<std::result::Result<Vec<_>, _>>()?
                .iter()
                .any(|n| n == "counter")
        };
        if !has_counter {
            // Another process may have added it since this connection
            // last read the schema: that is the same result.
            match self
                .conn
                .execute_batch("ALTER TABLE outbox ADD COLUMN counter INTEGER")
            {
                Err(e) if e.to_string().contains("duplicate column name") => {}
                other => other?,
            }
        }
        tx.commit()?;
        Ok(())
    }

    // ---- key/value -------------------------------------------------------

    pub fn get(&self, key: &str) -> Result<Option<String>> {
        Ok(self
            .conn
            .query_row("SELECT value FROM meta WHERE key = ?1", params![key], |r| {
                r.get(0)
            })
            .optional()?)
    }

    pub fn set(&self, key: &str, value: &str) -> Result<()> {
        self.conn.execute(
            "INSERT INTO meta (key, value) VALUES (?1, ?2)
             ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            params![key, value],
        )?;
        Ok(())
    }

    fn get_parsed<T: std::str::FromStr>(&self, key: &str) -> Result<Option<T>> {
        match self.get(key)? {
            None => Ok(None),
            Some(v) => v
                .parse()
                .map(Some)
                .map_err(|_| err!(Store, "database value {key}={v:?} is malformed")),
        }
    }

    /// Highest manifest serial ever accepted, on any channel and under any
    /// key document. Releases before channels compare against this value
    /// alone, so it only ever rises: after a rollback to such a release it
    /// still refuses every serial the newer one refused as a replay.
    pub fn serial(&self) -> Result<Option<u64>> {
        self.get_parsed("serial")
    }

    /// Newest signed time verified (clock floor).
    pub fn time_floor(&self) -> Result<Option<Timestamp>> {
        Ok(self.get_parsed::<i64>("time_floor")?.map(Timestamp))
    }

    // ---- serial floors -----------------------------------------------------
    //
    // A floor is kept per channel, with the key document version (the
    // *epoch*) its serial was accepted under: `floor.<channel>` holds
    // "<epoch> <serial>". A floor from an older epoch does not count, which
    // is how accepting a newer key document resets every channel's floor
    // without writing them all.
    //
    // The single `serial` of earlier releases also counts for the followed
    // channel while `serial_epoch` names the epoch in force: that is the
    // migration (the old floor becomes the floor of the device's channel)
    // and it picks up what an older release accepted after a rollback.
    // Switching channels detaches it, since its serials belong to the
    // channel left.

    /// The serial floor of `channel` (the one this device follows) under key
    /// document version `epoch`; `None` when nothing counts yet.
    pub fn floor(&self, channel: &str, epoch: u64) -> Result<Option<u64>> {
        let own = self
            .channel_floor(channel)?
            .and_then(|(e, s)| (e == epoch).then_some(s));
        // No `serial_epoch` yet: a database from before channels, whose
        // single serial is this channel's floor (see `adopt_legacy_floor`).
        let legacy = match self.get("serial_epoch")? {
            Some(e) if e != epoch.to_string() => None,
            _ => self.serial()?,
        };
        Ok(own.max(legacy))
    }

    /// The image a manifest of `channel` with `serial` named when that
    /// serial became the floor under key document `epoch`; `None` when not
    /// recorded (another serial or epoch since, or a floor an older release
    /// set). `serial_image.<channel>` holds "<epoch> <serial> <sha256>"; it
    /// is not part of the protected copy: losing it only means the next
    /// manifest with that serial is recorded afresh.
    pub fn serial_image(&self, channel: &str, epoch: u64, serial: u64) -> Result<Option<Sha256>> {
        let key = format!("serial_image.{channel}");
        let Some(v) = self.get(&key)? else {
            return Ok(None);
        };
        let mut parts = v.split(' ');
        let (e, n, sha) = (parts.next(), parts.next(), parts.next());
        let parsed = e
            .and_then(|e| e.parse::<u64>().ok())
            .zip(n.and_then(|n| n.parse::<u64>().ok()));
        match (parsed, sha.map(Sha256::from_hex)) {
            (Some((e, n)), Some(Ok(sha))) => Ok((e == epoch && n == serial).then_some(sha)),
            _ => bail!(Store, "database value {key}={v:?} is malformed"),
        }
    }

    /// `floor.<channel>` as stored: (epoch, serial).
    fn channel_floor(&self, channel: &str) -> Result<Option<(u64, u64)>> {
        let key = format!("floor.{channel}");
        let Some(v) = self.get(&key)? else {
            return Ok(None);
        };
        let parsed = v
            .split_once(' ')
            .and_then(|(e, s)| Some((e.parse().ok()?, s.parse().ok()?)));
        match parsed {
            Some(p) => Ok(Some(p)),
            None => bail!(Store, "database value {key}={v:?} is malformed"),
        }
    }

    /// Record a verified manifest of `channel` under key document `epoch`:
    /// the channel's floor, the all-time serial and the clock floor only
    /// ever rise (a floor from an older epoch is replaced).
    pub fn accept_manifest(
        &self,
        channel: &str,
        epoch: u64,
        serial: u64,
        issued: Timestamp,
        image: &Sha256,
    ) -> Result<()> {
        self.atomically(|s| {
            let floor = s.floor(channel, epoch)?;
            if floor.is_none_or(|f| serial > f) {
                s.set(&format!("floor.{channel}"), &format!("{epoch} {serial}"))?;
            }
            // The image of the floor's serial, written with the floor (or
            // the first time it is seen, for a floor an older release set).
            if floor.is_none_or(|f| serial >= f)
                && s.serial_image(channel, epoch, serial)?.is_none()
            {
                s.set(
                    &format!("serial_image.{channel}"),
                    &format!("{epoch} {serial} {}", image.to_hex()),
                )?;
            }
            if s.serial()?.is_none_or(|o| serial > o) {
                s.set("serial", &serial.to_string())?;
                s.set("serial_epoch", &epoch.to_string())?;
            }
            if s.time_floor()?.is_none_or(|f| issued > f) {
                s.set("time_floor", &issued.0.to_string())?;
            }
            Ok(())
        })
    }

    /// First start on a database written before channels: the single
    /// serial becomes the floor of the followed channel under the key
    /// document in force. Does nothing once `serial_epoch` exists.
    pub fn adopt_legacy_floor(&self, epoch: u64) -> Result<()> {
        if self.get("serial_epoch")?.is_none() && self.serial()?.is_some() {
            self.set("serial_epoch", &epoch.to_string())?;
        }
        Ok(())
    }

    /// The channel an operator chose, kept on the data partition so a new
    /// image's configuration does not undo it.
    pub fn channel_choice(&self) -> Result<Option<String>> {
        Ok(self.get("channel")?.filter(|c| !c.is_empty()))
    }

    /// Follow `to` (or, with `None`, the configuration's channel again) from
    /// now on, leaving `from`: `from`'s floor is written down under its own
    /// name and the single serial no longer counts for any channel.
    pub fn choose_channel(&self, from: &str, to: Option<&str>, epoch: u64) -> Result<()> {
        self.atomically(|s| {
            if let Some(f) = s.floor(from, epoch)? {
                s.set(&format!("floor.{from}"), &format!("{epoch} {f}"))?;
            }
            s.set("serial_epoch", "detached")?;
            // The cached manifest and its ETag belong to the channel left.
            s.set("etag", "")?;
            s.set("channel", to.unwrap_or(""))
        })
    }

    // ---- trust -----------------------------------------------------------

    /// Every stored key document with the version it was stored under.
    pub fn key_documents(&self) -> Result<Vec<(u64, Vec<u8>)>> {
        let mut stmt = self
            .conn
            .prepare("SELECT version, envelope FROM key_documents ORDER BY version")?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?)))?;
        let mut docs = Vec::new();
        for row in rows {
            let (v, raw) = row?;
            docs.push((v as u64, raw));
        }
        Ok(docs)
    }

    /// Forget a stored key document that no longer chains.
    pub fn forget_key_document(&self, version: u64) -> Result<()> {
        self.conn.execute(
            "DELETE FROM key_documents WHERE version = ?1",
            params![version as i64],
        )?;
        Ok(())
    }

    pub fn put_key_document(&self, version: u64, envelope: &[u8]) -> Result<()> {
        self.conn.execute(
            "INSERT OR REPLACE INTO key_documents (version, envelope, accepted) VALUES (?1, ?2, ?3)",
            params![version as i64, envelope, Timestamp::now().0],
        )?;
        Ok(())
    }

    // ---- state machine ---------------------------------------------------

    /// The persisted state (`Idle` on a fresh database) and since when.
    pub fn state(&self) -> Result<(State, Timestamp)> {
        let row: Option<(String, i64)> = self
            .conn
            .query_row("SELECT body, since FROM state WHERE id = 1", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()?;
        match row {
            None => Ok((State::Idle, Timestamp(0))),
            Some((body, since)) => {
                let s = State::from_json(body.as_bytes())
                    .map_err(|e| err!(Store, "stored state is unreadable ({e}): {body}"))?;
                Ok((s, Timestamp(since)))
            }
        }
    }

    /// Move to `next`, with its history line and reports, in one durable
    /// transaction. Refuses a transition the state machine does not have.
    pub fn transition(
        &self,
        next: &State,
        event: Option<&Event<'_>>,
        reports: &[Report<'_>],
    ) -> Result<()> {
        let tx = self.conn.unchecked_transaction()?;
        let (current, _) = self.state()?;
        if !current.can_become(next) {
            bail!(
                Store,
                "illegal state transition {} -> {}",
                current.name(),
                next.name()
            );
        }
        self.put_state(next)?;
        if let Some(e) = event {
            self.add_history(e)?;
        }
        for r in reports {
            self.push_report(r)?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Update the data of the current state (progress), same state name.
    pub fn update_state(&self, state: &State) -> Result<()> {
        let (current, _) = self.state()?;
        if current.name() != state.name() {
            bail!(
                Store,
                "state update {} while in {}",
                state.name(),
                current.name()
            );
        }
        let body = serde_json::to_string(state).map_err(|e| err!(Store, "encoding state: {e}"))?;
        self.conn
            .execute("UPDATE state SET body = ?1 WHERE id = 1", params![body])?;
        Ok(())
    }

    fn put_state(&self, s: &State) -> Result<()> {
        let body = serde_json::to_string(s).map_err(|e| err!(Store, "encoding state: {e}"))?;
        self.conn.execute(
            "INSERT INTO state (id, body, since) VALUES (1, ?1, ?2)
             ON CONFLICT(id) DO UPDATE SET body = excluded.body, since = excluded.since",
            params![body, Timestamp::now().0],
        )?;
        Ok(())
    }

    // ---- slots and rejected releases --------------------------------------

    pub fn slot_record(&self, slot: SlotName) -> Result<Option<SlotRecord>> {
        let row: Option<(String, String, i64, i64)> = self
            .conn
            .query_row(
                "SELECT version, sha256, size, installed FROM slots WHERE name = ?1",
                params![slot.as_str()],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .optional()?;
        row.map(|(version, sha, size, installed)| {
            Ok(SlotRecord {
                slot,
                version,
                sha256: Sha256::from_hex(&sha).map_err(|e| e.with_kind(Kind::Store))?,
                size: size as u64,
                installed: Timestamp(installed),
            })
        })
        .transpose()
    }

    pub fn set_slot_record(&self, r: &SlotRecord) -> Result<()> {
        self.conn.execute(
            "INSERT OR REPLACE INTO slots (name, version, sha256, size, installed) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![r.slot.as_str(), r.version, r.sha256.to_hex(), r.size as i64, r.installed.0],
        )?;
        Ok(())
    }

    pub fn forget_slot(&self, slot: SlotName) -> Result<()> {
        self.conn
            .execute("DELETE FROM slots WHERE name = ?1", params![slot.as_str()])?;
        self.conn.execute(
            "DELETE FROM meta WHERE key = ?1",
            params![partial_key(slot)],
        )?;
        Ok(())
    }

    /// What a download that ended before its last frame left on `slot`:
    /// the artifact it was writing (its sha256) and how many of its frames
    /// were durable. A later job writing the same artifact there starts
    /// after them (the next ones re-checked on the slot, the whole image
    /// verified at the end); any write to the slot forgets it
    /// ([`Store::forget_slot`]).
    pub fn partial_write(&self, slot: SlotName) -> Result<Option<(Sha256, u64)>> {
        let Some(v) = self.get(&partial_key(slot))? else {
            return Ok(None);
        };
        let parsed = v.split_once(' ').and_then(|(sha, frames)| {
            Some((Sha256::from_hex(sha).ok()?, frames.parse::<u64>().ok()?))
        });
        // Unreadable: as if nothing were kept (the write starts at frame 0).
        Ok(parsed)
    }

    /// Record what a download that ended early left on `slot`.
    pub fn set_partial_write(&self, slot: SlotName, artifact: &Sha256, frames: u64) -> Result<()> {
        self.set(
            &partial_key(slot),
            &format!("{} {frames}", artifact.to_hex()),
        )
    }

    /// Why an image was rejected before, if it was.
    pub fn rejected(&self, sha: &Sha256) -> Result<Option<String>> {
        Ok(self
            .conn
            .query_row(
                "SELECT reason FROM rejected WHERE sha256 = ?1",
                params![sha.to_hex()],
                |r| r.get(0),
            )
            .optional()?)
    }

    pub fn reject(&self, sha: &Sha256, version: &str, reason: &str) -> Result<()> {
        self.conn.execute(
            "INSERT OR REPLACE INTO rejected (sha256, version, reason, time) VALUES (?1, ?2, ?3, ?4)",
            params![sha.to_hex(), version, reason, Timestamp::now().0],
        )?;
        Ok(())
    }

    /// Forget a rejection (explicit operator install).
    pub fn unreject(&self, sha: &Sha256) -> Result<()> {
        self.conn.execute(
            "DELETE FROM rejected WHERE sha256 = ?1",
            params![sha.to_hex()],
        )?;
        Ok(())
    }

    // ---- history -----------------------------------------------------------

    pub fn add_history(&self, e: &Event<'_>) -> Result<()> {
        self.conn.execute(
            "INSERT INTO history (time, event, release, slot, detail) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                Timestamp::now().0,
                e.event,
                e.release,
                e.slot.map(|s| s.as_str()),
                e.detail
            ],
        )?;
        self.conn.execute(
            "DELETE FROM history WHERE id <= (SELECT MAX(id) FROM history) - ?1",
            params![HISTORY_KEEP],
        )?;
        Ok(())
    }

    /// Newest last, at most `limit` entries.
    pub fn history(&self, limit: usize) -> Result<Vec<HistoryEntry>> {
        let mut stmt = self.conn.prepare(
            "SELECT id, time, event, release, slot, detail FROM
               (SELECT * FROM history ORDER BY id DESC LIMIT ?1) ORDER BY id",
        )?;
        let rows = stmt.query_map(params![limit as i64], history_row)?;
        rows.collect::<std::result::Result<Vec<_>, _>>()
            .map_err(Error::from)
    }

    /// The newest history line whose event is one of `events`.
    pub fn newest_event(&self, events: &[&str]) -> Result<Option<HistoryEntry>> {
        let marks = vec!["?"; events.len()].join(", ");
        let mut stmt = self.conn.prepare(&format!(
            "SELECT id, time, event, release, slot, detail FROM history
             WHERE event IN ({marks}) ORDER BY id DESC LIMIT 1"
        ))?;
        Ok(stmt
            .query_row(rusqlite::params_from_iter(events), history_row)
            .optional()?)
    }

    /// Run `f` in one transaction.
    pub fn atomically<T>(&self, f: impl FnOnce(&Store) -> Result<T>) -> Result<T> {
        let tx = self.conn.unchecked_transaction()?;
        let v = f(self)?;
        tx.commit()?;
        Ok(v)
    }
}

/// A `history` row selected as `id, time, event, release, slot, detail`.
fn history_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<HistoryEntry> {
    Ok(HistoryEntry {
        id: r.get(0)?,
        time: Timestamp(r.get(1)?),
        event: r.get(2)?,
        release: r.get(3)?,
        slot: r.get(4)?,
        detail: r.get(5)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Job;

    fn db(name: &str) -> Store {
        let d = std::env::temp_dir().join(format!("updraft-store-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Store::open(&d.join("updraft.db")).unwrap()
    }

    fn job() -> Job {
        crate::test_support::job_into(SlotName::B)
    }

    fn img(n: u8) -> Sha256 {
        Sha256::of(&[n])
    }

    /// The image named under the floor's serial is kept with it, per
    /// channel and key document; a lower serial leaves it alone.
    #[test]
    fn the_floor_serial_keeps_the_image_it_named() {
        let s = db("serial-image");
        assert_eq!(s.serial_image("stable", 1, 5).unwrap(), None);
        s.accept_manifest("stable", 1, 5, Timestamp(100), &img(1))
            .unwrap();
        s.accept_manifest("stable", 1, 5, Timestamp(100), &img(2))
            .unwrap();
        s.accept_manifest("stable", 1, 4, Timestamp(100), &img(3))
            .unwrap();
        assert_eq!(s.serial_image("stable", 1, 5).unwrap(), Some(img(1)));
        assert_eq!(s.serial_image("stable", 1, 4).unwrap(), None);
        assert_eq!(s.serial_image("stable", 2, 5).unwrap(), None);
        assert_eq!(s.serial_image("beta", 1, 5).unwrap(), None);
        s.accept_manifest("stable", 1, 6, Timestamp(100), &img(3))
            .unwrap();
        assert_eq!(s.serial_image("stable", 1, 6).unwrap(), Some(img(3)));
        assert_eq!(s.serial_image("stable", 1, 5).unwrap(), None);
        s.set("serial_image.stable", "1 6 nothex").unwrap();
        assert!(s.serial_image("stable", 1, 6).is_err());
    }

    #[test]
    fn serial_and_floor_only_rise() {
        let s = db("serial");
        assert_eq!(s.serial().unwrap(), None);
        s.accept_manifest("stable", 1, 5, Timestamp(100), &img(1))
            .unwrap();
        s.accept_manifest("stable", 1, 3, Timestamp(50), &img(2))
            .unwrap();
        assert_eq!(s.serial().unwrap(), Some(5));
        assert_eq!(s.floor("stable", 1).unwrap(), Some(5));
        assert_eq!(s.time_floor().unwrap(), Some(Timestamp(100)));
    }

    #[test]
    fn a_newer_key_document_resets_the_floors_but_never_the_all_time_serial() {
        let s = db("epochs");
        s.accept_manifest("stable", 1, u64::MAX, Timestamp(100), &img(1))
            .unwrap();
        assert_eq!(s.floor("stable", 1).unwrap(), Some(u64::MAX));
        // Under key document 2 nothing counts yet; serial 6 is accepted.
        assert_eq!(s.floor("stable", 2).unwrap(), None);
        s.accept_manifest("stable", 2, 6, Timestamp(200), &img(2))
            .unwrap();
        assert_eq!(s.floor("stable", 2).unwrap(), Some(6));
        // What releases before channels compare against stays the maximum.
        assert_eq!(s.serial().unwrap(), Some(u64::MAX));
        assert_eq!(s.get("serial_epoch").unwrap().as_deref(), Some("1"));
    }

    #[test]
    fn the_single_serial_of_earlier_releases_becomes_the_followed_channels_floor() {
        let s = db("legacy");
        s.set("serial", "40").unwrap();
        s.adopt_legacy_floor(3).unwrap();
        assert_eq!(s.floor("stable", 3).unwrap(), Some(40));
        assert_eq!(s.floor("stable", 4).unwrap(), None);
        // An older release raising it after a rollback still counts.
        s.set("serial", "41").unwrap();
        assert_eq!(s.floor("stable", 3).unwrap(), Some(41));
        // Leaving the channel writes its floor down and detaches the serial.
        s.choose_channel("stable", Some("beta"), 3).unwrap();
        assert_eq!(s.channel_choice().unwrap().as_deref(), Some("beta"));
        assert_eq!(s.floor("beta", 3).unwrap(), None);
        assert_eq!(s.floor("stable", 3).unwrap(), Some(41));
        s.choose_channel("beta", None, 3).unwrap();
        assert_eq!(s.channel_choice().unwrap(), None);
        assert_eq!(s.floor("stable", 3).unwrap(), Some(41));
    }

    #[test]
    fn a_malformed_floor_is_named() {
        let s = db("badfloor");
        s.set("floor.stable", "x").unwrap();
        let e = s.floor("stable", 0).unwrap_err();
        assert!(e.message().contains("floor.stable"), "{e}");
    }

    #[test]
    fn transitions_are_checked() {
        let s = db("trans");
        assert_eq!(s.state().unwrap().0, State::Idle);
        let e = s.transition(&State::Testing(job()), None, &[]).unwrap_err();
        assert!(
            e.to_string()
                .contains("illegal state transition idle -> testing")
        );
        s.transition(&State::Checking, None, &[]).unwrap();
        s.transition(
            &State::Downloading(job()),
            Some(&Event {
                event: "download",
                ..Default::default()
            }),
            &[],
        )
        .unwrap();
        assert_eq!(s.state().unwrap().0, State::Downloading(job()));
        assert_eq!(s.history(10).unwrap().len(), 1);
    }

    #[test]
    fn newest_event_picks_the_latest_of_the_named_events() {
        let s = db("newest");
        assert!(s.newest_event(&["committed"]).unwrap().is_none());
        for (event, release) in [
            ("committed", "1.0"),
            ("download", "2.0"),
            ("rolled-back", "2.0"),
            ("download", "3.0"),
        ] {
            s.add_history(&Event {
                event,
                release: Some(release),
                slot: Some(SlotName::B),
                detail: Some("why"),
            })
            .unwrap();
        }
        let e = s
            .newest_event(&["committed", "rolled-back"])
            .unwrap()
            .unwrap();
        assert_eq!(
            (e.event.as_str(), e.release.as_deref()),
            ("rolled-back", Some("2.0"))
        );
        let e = s.newest_event(&["committed"]).unwrap().unwrap();
        assert_eq!(e.release.as_deref(), Some("1.0"));
        assert_eq!(e.slot.as_deref(), Some("B"));
    }

    #[test]
    fn processes_opening_a_new_database_at_once_all_succeed() {
        for round in 0..40 {
            let dir = std::env::temp_dir()
                .join(format!("updraft-store-race-{}-{round}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join("updraft.db");
            let start = std::sync::Arc::new(std::sync::Barrier::new(4));
            let openers: Vec<_> = (0..4)
                .map(|_| {
                    let (path, start) = (path.clone(), start.clone());
                    std::thread::spawn(move || {
                        start.wait();
                        Store::open(&path).map(|_| ()).map_err(|e| e.to_string())
                    })
                })
                .collect();
            for o in openers {
                assert_eq!(o.join().unwrap(), Ok(()), "round {round}");
            }
            let s = Store::open(&path).unwrap();
            assert_eq!(
                s.get("schema_version").unwrap(),
                Some(SCHEMA_VERSION.to_string())
            );
            drop(s);
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    #[test]
    fn every_new_row_gets_the_next_report_counter_and_a_fold_keeps_its_own() {
        let s = db("counter");
        let r = |key: &'static str, foldable: bool| Report {
            key,
            kind: if foldable { "heartbeat" } else { "state" },
            foldable,
            body: "{}",
        };
        s.push_report(&r("s1", false)).unwrap();
        s.push_report(&r("h1", true)).unwrap();
        s.push_report(&r("h2", true)).unwrap();
        // In a transition's transaction, rolled back: its counter is
        // not spent, as nothing of it was stored.
        let failed = s.atomically(|st| {
            st.push_report(&r("s2", false))?;
            Err::<(), _>(err!(Store, "the transition fails"))
        });
        assert!(failed.is_err());
        s.push_report(&r("s3", false)).unwrap();
        let rows = s.outbox_peek(10).unwrap();
        let counters: Vec<(&str, Option<u64>)> =
            rows.iter().map(|e| (e.key.as_str(), e.counter)).collect();
        assert_eq!(
            counters,
            [("s1", Some(1)), ("h1", Some(2)), ("s3", Some(3))]
        );
        // Delivered rows leave; the counter goes on from the highest ever.
        assert_eq!(s.report_counter_delivered().unwrap(), 0);
        for e in &rows {
            s.outbox_ack_delivered(e.seq, e.counter).unwrap();
        }
        assert_eq!(s.report_counter_delivered().unwrap(), 3);
        s.push_report(&r("s4", false)).unwrap();
        assert_eq!(s.outbox_peek(1).unwrap()[0].counter, Some(4));
        // An unreadable stored counter never makes one repeat.
        s.set("report_counter", "garbage").unwrap();
        s.push_report(&r("s5", false)).unwrap();
        assert_eq!(s.outbox_peek(2).unwrap()[1].counter, Some(5));
        // A row an older release queued has none.
        s.conn
            .execute(
                "INSERT INTO outbox (key, kind, created, updated, body) VALUES ('old', 'state', 0, 0, '{}')",
                [],
            )
            .unwrap();
        assert_eq!(s.outbox_peek(3).unwrap()[2].counter, None);
    }

    #[test]
    fn outbox_folds_only_the_newest_foldable_row() {
        let s = db("outbox");
        fn hb(k: &str) -> Report<'_> {
            Report {
                key: k,
                kind: "heartbeat",
                foldable: true,
                body: "{}",
            }
        }
        s.push_report(&hb("h1")).unwrap();
        s.push_report(&hb("h2")).unwrap();
        s.push_report(&Report {
            key: "r1",
            kind: "install",
            foldable: false,
            body: "{}",
        })
        .unwrap();
        s.push_report(&hb("h3")).unwrap();
        s.push_report(&hb("h4")).unwrap();
        let rows = s.outbox_peek(10).unwrap();
        let summary: Vec<(&str, i64)> = rows.iter().map(|r| (r.key.as_str(), r.count)).collect();
        assert_eq!(summary, vec![("h1", 2), ("r1", 1), ("h3", 2)]);
        s.outbox_ack(rows[0].seq).unwrap();
        assert_eq!(s.outbox_len().unwrap(), 2);
        // A row being sent is not folded into: what it would carry would
        // go with the row.
        let newest = rows[2].seq;
        s.push_report_besides(&hb("h5"), Some(newest)).unwrap();
        let keys: Vec<String> = s
            .outbox_peek(10)
            .unwrap()
            .into_iter()
            .map(|r| r.key)
            .collect();
        assert_eq!(keys, vec!["r1", "h3", "h5"]);
    }
}
