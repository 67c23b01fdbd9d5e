//! The protection: a copy of what must outlive `updraft.db`.
//!
//! SD cards and eMMC lose sectors after power cuts and wear, and the
//! database is the file written most. Most of it is expendable — the
//! history, the outbox, a job in progress (the slots and the bootloader say
//! where a device stands) — but not its protection against rollback and
//! replay: the serial floors per channel and key epoch, the all-time serial
//! and the clock floor, the key documents accepted (a revoked key must stay
//! revoked), the images rejected and what each slot holds. Without those a
//! device whose database was rebuilt would take a replayed older manifest.
//!
//! So this module keeps [`Protected`] in a second, small file beside the
//! database, `protected.json`, written whole (temporary file, `fsync`,
//! rename) only when it changes, and checksummed: `{"format": 1, "body":
//! "<JSON>", "sha256": "<hex of body>"}`. On open ([`open_store`]) a database
//! that is damaged (SQLite says it is not a database or malformed, or its
//! `quick_check` fails) is moved aside with a timestamp — never deleted —
//! and a fresh one is made from the copy; so is an empty database found
//! where a copy says there was more (a zero-length or deleted file). A
//! restore only ever raises a floor.
//!
//! This module never decides what a floor is (that is [`crate::store`] and
//! [`crate::poll`]) and never deletes a database.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Context, Kind, Result};
use crate::fsutil::atomic_write;
use crate::hash::Sha256;
use crate::store::{Opened, Protected, Store};
use crate::timestamp::Timestamp;
use crate::{bail, err};

/// The copy's file name in the state directory.
pub const FILE_NAME: &str = "protected.json";

/// The format this release writes and reads.
const FORMAT: u32 = 1;

/// Larger copies are refused unread: thousands of key documents would not
/// reach this.
const MAX_BYTES: u64 = 4 * 1024 * 1024;

#[derive(Serialize, Deserialize)]
struct File {
    format: u32,
    body: String,
    sha256: String,
}

/// The copy beside the database at `db`.
pub fn path_beside(db: &Path) -> PathBuf {
    db.with_file_name(FILE_NAME)
}

/// The bytes of the file that keeps `p`.
pub fn encode(p: &Protected) -> Result<Vec<u8>> {
    let body = serde_json::to_string(p).map_err(|e| err!(Io, "encoding the protection: {e}"))?;
    let sha256 = Sha256::of(body.as_bytes()).to_hex();
    let mut out = serde_json::to_vec(&File {
        format: FORMAT,
        body,
        sha256,
    })
    .map_err(|e| err!(Io, "encoding the protection: {e}"))?;
    out.push(b'\n');
    Ok(out)
}

/// What the file's bytes keep, if they are whole: any change to them is
/// an error of kind [`Kind::Integrity`] naming what is wrong.
pub fn decode(bytes: &[u8]) -> Result<Protected> {
    let f: File =
        serde_json::from_slice(bytes).map_err(|e| err!(Malformed, "not a protection file: {e}"))?;
    if f.format != FORMAT {
        bail!(Malformed, "protection format {} is not {FORMAT}", f.format);
    }
    let sum = Sha256::of(f.body.as_bytes()).to_hex();
    if sum != f.sha256 {
        bail!(
            Integrity,
            "the protection's checksum does not match its content (sha256 {sum}, recorded {})",
            crate::hash::truncate(&f.sha256, 64)
        );
    }
    serde_json::from_str(&f.body).map_err(|e| err!(Malformed, "the protection's body: {e}"))
}

/// Read the copy at `path`: `None` when there is none.
pub fn load(path: &Path) -> Result<Option<Protected>> {
    let bytes = match std::fs::metadata(path) {
        Ok(m) if m.len() > MAX_BYTES => bail!(
            Malformed,
            "{} is {} bytes, more than a protection can be",
            path.display(),
            m.len()
        ),
        Ok(_) => std::fs::read(path).with_context(|| format!("reading {}", path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(crate::error::Error::from(e).wrap(format!("reading {}", path.display())));
        }
    };
    decode(&bytes)
        .map(Some)
        .map_err(|e| e.wrap(path.display().to_string()))
}

/// Keeps the copy up to date with the database: writes it when what it
/// protects changed since the last write.
pub struct Keeper {
    path: PathBuf,
    written: Option<Sha256>,
}

impl Keeper {
    pub fn new(db: &Path) -> Keeper {
        Keeper {
            path: path_beside(db),
            written: None,
        }
    }

    /// Write the copy if `store`'s protected values changed; true when it
    /// was written.
    pub fn save(&mut self, store: &Store) -> Result<bool> {
        let bytes = encode(&store.protected()?)?;
        let sum = Sha256::of(&bytes);
        if self.written == Some(sum) {
            return Ok(false);
        }
        if self.written.is_none() && std::fs::read(&self.path).is_ok_and(|b| b == bytes) {
            self.written = Some(sum);
            return Ok(false);
        }
        atomic_write(&self.path, &bytes, 0o600)
            .with_context(|| format!("writing {}", self.path.display()))?;
        self.written = Some(sum);
        Ok(true)
    }
}

/// A database rebuilt at open: what happened, for the log, the history
/// and the report.
#[derive(Debug)]
pub struct Recovered {
    /// Why the file was not used.
    pub why: String,
    /// Where the damaged file went (`None`: it was empty, nothing to keep).
    pub moved_to: Option<PathBuf>,
    /// Whether the protection could be restored (else the floors start
    /// afresh).
    pub restored: bool,
}

impl Recovered {
    pub fn describe(&self, db: &Path) -> String {
        let moved = match &self.moved_to {
            Some(p) => format!("moved to {}", p.display()),
            None => "nothing to keep".into(),
        };
        let restored = if self.restored {
            format!(
                "floors, key documents, rejected images and slot records restored from {}",
                FILE_NAME
            )
        } else {
            format!(
                "no usable {FILE_NAME}: serial floors start afresh, and a validly signed, unexpired manifest of any serial is accepted once"
            )
        };
        format!(
            "database {} could not be used ({}); {moved}; a new one was made, {restored}",
            db.display(),
            self.why
        )
    }
}

/// Open the database at `db`, rebuilding it from the protection when it is
/// damaged or was emptied.
pub fn open_store(db: &Path) -> Result<(Store, Option<Recovered>)> {
    let copy_path = path_beside(db);
    let (store, why, moved_to) = match Store::open_checked(db)? {
        Opened::Usable(store) => match store.validate() {
            Err(e) => {
                drop(store);
                let aside = move_aside(db)?;
                (Store::open(db)?, e.to_string(), Some(aside))
            }
            Ok(()) if !store.is_blank()? => {
                merge(&store, &copy_path);
                return Ok((store, None));
            }
            // Blank: a new device (nothing to restore, no recovery), or a
            // database that was emptied.
            Ok(()) => match load(&copy_path) {
                Ok(Some(p)) if p != Protected::default() => {
                    (store, "it was empty".to_string(), None)
                }
                _ => return Ok((store, None)),
            },
        },
        Opened::Damaged(why) => {
            let aside = move_aside(db)?;
            (Store::open(db)?, why, Some(aside))
        }
    };
    let restored = match load(&copy_path) {
        Ok(Some(p)) => {
            store
                .restore(&p)
                .with_context(|| format!("restoring {}", copy_path.display()))?;
            true
        }
        Ok(None) => false,
        Err(e) => {
            log::error!("the protection cannot be used: {e}");
            false
        }
    };
    Ok((
        store,
        Some(Recovered {
            why,
            moved_to,
            restored,
        }),
    ))
}

/// Merge the copy into a database that opened well: a floor that is lower
/// in the database than in its copy (a flipped byte inside a value, which
/// SQLite cannot see) is raised back, and said.
fn merge(store: &Store, copy_path: &Path) {
    let copy = match load(copy_path) {
        Ok(Some(p)) => p,
        Ok(None) => return,
        Err(e) => {
            log::warn!("the protection cannot be used (it is written again): {e}");
            return;
        }
    };
    let before = store.protected().ok();
    if let Err(e) = store.restore(&copy) {
        log::warn!("merging {}: {e}", copy_path.display());
        return;
    }
    if let (Some(b), Ok(a)) = (before, store.protected()) {
        if a.meta != b.meta {
            log::warn!(
                "the database's floors were lower than its protected copy's; raised back from {}",
                copy_path.display()
            );
        }
    }
}

/// Rename the database (and its journal, if any) to
/// `updraft.db.damaged-<unix time>`; never deleted.
fn move_aside(db: &Path) -> Result<PathBuf> {
    let stamp = Timestamp::now().0;
    let name = db
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "updraft.db".into());
    let mut aside = db.with_file_name(format!("{name}.damaged-{stamp}"));
    let mut n = 1;
    while aside.exists() {
        aside = db.with_file_name(format!("{name}.damaged-{stamp}-{n}"));
        n += 1;
    }
    std::fs::rename(db, &aside).map_err(|e| {
        err!(
            Store,
            "moving the damaged database {} aside to {}: {e}",
            db.display(),
            aside.display()
        )
    })?;
    let journal = db.with_file_name(format!("{name}-journal"));
    if journal.exists() {
        let to = aside.with_file_name(format!(
            "{}-journal",
            aside
                .file_name()
                .map(|n| n.to_string_lossy())
                .unwrap_or_default()
        ));
        if let Err(e) = std::fs::rename(&journal, &to) {
            log::warn!("moving {} aside: {e}", journal.display());
        }
    }
    if let Some(dir) = db.parent() {
        crate::fsutil::sync_dir(dir).kind_context(Kind::Store, "syncing the state directory")?;
    }
    Ok(aside)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::scratch_dir;

    fn sample() -> Protected {
        let mut p = Protected::default();
        p.meta.insert("floor.stable".into(), "2 41".into());
        p.meta.insert("serial".into(), "41".into());
        p.key_documents.push((2, "e30=".into()));
        p.rejected.push((
            "ab".repeat(32),
            "3.0".into(),
            "health check failed".into(),
            7,
        ));
        p
    }

    /// The file sealed around `body` with its own checksum, so that the
    /// body's parser is reached.
    fn sealed(body: &str) -> Vec<u8> {
        serde_json::to_vec(&File {
            format: FORMAT,
            body: body.to_string(),
            sha256: Sha256::of(body.as_bytes()).to_hex(),
        })
        .unwrap()
    }

    #[test]
    fn hostile_bytes_are_errors_and_what_decodes_encodes_to_itself() {
        let whole = encode(&sample()).unwrap();
        let mut inputs: Vec<Vec<u8>> = (0..whole.len()).map(|n| whole[..n].to_vec()).collect();
        for body in [
            "",
            "null",
            "[]",
            "{}",
            "{\"meta\": 5}",
            "{\"meta\": {\"serial\": 41}}",
            "{\"key_documents\": [[-1, \"e30=\"]]}",
            "{\"key_documents\": [[18446744073709551616, \"\"]]}",
            "{\"rejected\": [[\"ab\", \"3.0\"]]}",
            "{\"rejected\": [[\"ab\", \"3.0\", \"why\", 7, 8]]}",
            &"[".repeat(10_000),
            "{\"meta\": {\"a\": \"\\ud800\"}}",
        ] {
            inputs.push(sealed(body));
        }
        inputs.push(b"{\"format\": 2, \"body\": \"{}\", \"sha256\": \"\"}".to_vec());
        inputs.push(vec![0xff; 64]);
        for bytes in &inputs {
            match decode(bytes) {
                Ok(p) => assert_eq!(decode(&encode(&p).unwrap()).unwrap(), p),
                Err(e) => assert!(!e.to_string().is_empty()),
            }
        }
        // A body that is whole decodes.
        let body = serde_json::to_string(&sample()).unwrap();
        assert_eq!(decode(&sealed(&body)).unwrap(), sample());
    }

    #[test]
    fn a_copy_reads_back_and_any_flipped_byte_is_caught() {
        let bytes = encode(&sample()).unwrap();
        assert_eq!(decode(&bytes).unwrap(), sample());
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x04;
            if let Ok(p) = decode(&b) {
                // Only a flip serde reads as the same text (the case of a
                // hex digit in the checksum is not one) may pass, and then
                // it must say the same.
                assert_eq!(p, sample(), "byte {i} changed what the copy says");
            }
        }
        assert!(decode(&bytes[..bytes.len() / 2]).is_err());
        assert!(decode(b"").is_err());
    }

    #[test]
    fn the_keeper_writes_only_when_something_changed() {
        let dir = scratch_dir("protect", "keeper");
        let db = dir.join("updraft.db");
        let store = Store::open(&db).unwrap();
        let mut k = Keeper::new(&db);
        assert!(k.save(&store).unwrap());
        assert!(!k.save(&store).unwrap());
        store
            .accept_manifest("stable", 0, 5, Timestamp(10), &Sha256::of(b"image"))
            .unwrap();
        assert!(k.save(&store).unwrap());
        assert_eq!(
            load(&path_beside(&db)).unwrap().unwrap().meta["floor.stable"],
            "0 5"
        );
        // A new keeper finds the file up to date.
        assert!(!Keeper::new(&db).save(&store).unwrap());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
