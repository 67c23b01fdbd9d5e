//! The kinds of events updraft records, one name per kind: the same name in
//! the history (`updraft history`), in the journal (`UPDRAFT_EVENT=`) and in
//! the catalog, each with a fixed journal `MESSAGE_ID` and the text
//! `journalctl -x` shows beside an entry of that kind.
//!
//! Why fixed IDs: journald's catalog, an operator's filters
//! (`journalctl MESSAGE_ID=304d0bca…`) and a log shipper's alerts key on
//! them, whatever the message text says. An ID, once given to a kind, never
//! changes and never moves to another kind; a new kind gets a new ID.
//!
//! The catalog file that packages install
//! (`/usr/lib/systemd/catalog/updraft.catalog`, kept in the tree as
//! `systemd/updraft.catalog`) is [`catalog()`]'s text; a unit test keeps the
//! two the same.
//!
//! This module owns the table and the catalog text made from it. It never
//! logs, writes or decides anything: the log lines that carry a kind are
//! made where the event happens ([`crate::logging::event`]).

/// One kind of event.
#[derive(Debug)]
pub struct EventKind {
    /// The history's event name (`committed`).
    pub name: &'static str,
    /// journald's `MESSAGE_ID`: 128 bits as 32 lowercase hex digits.
    pub message_id: &'static str,
    /// The catalog's one-line subject; `@FIELD@` is replaced with the
    /// entry's field by `journalctl -x`.
    pub subject: &'static str,
    /// What it means and what an operator does about it.
    pub body: &'static str,
}

/// Every kind, in the order of an update's life.
pub const KINDS: &[EventKind] = &[
    EventKind {
        name: "download",
        message_id: "593680e14c5116368e69ce03e6f3cb82",
        subject: "Started downloading release @UPDRAFT_RELEASE@ into slot @UPDRAFT_SLOT@",
        body: "A verified manifest named a release this device does not run, and its \
               policy let the release be written: the download into the inactive slot \
               started (a full image, or a delta and its size). Nothing on the active \
               slot changes until the new one is verified.",
    },
    EventKind {
        name: "delta-fallback",
        message_id: "f9f3b7f0eb96c5506710695e0b613e1a",
        subject: "Fell back to the full image of release @UPDRAFT_RELEASE@",
        body: "The delta of this release could not be used (its source did not match \
               the active slot, or it failed to apply): the full image is downloaded \
               instead. No action is needed; a fleet where this happens often ships \
               deltas from a release the devices do not run.",
    },
    EventKind {
        name: "verify",
        message_id: "ab9ca4125720e600efda8a9eaf70e572",
        subject: "Verifying release @UPDRAFT_RELEASE@ on slot @UPDRAFT_SLOT@",
        body: "Every byte of the release is on the inactive slot; it is being read \
               back and compared with the signed hashes before the slot may boot.",
    },
    EventKind {
        name: "installed",
        message_id: "bd4bd9f2a28e3159a6acde6052f8de62",
        subject: "Installed release @UPDRAFT_RELEASE@ on slot @UPDRAFT_SLOT@",
        body: "The slot holds the release, verified against its signed hashes, and the \
               bootloader is set for a counted trial boot of it. The reboot follows \
               when the device's policy (maintenance window, inhibitors) allows.",
    },
    EventKind {
        name: "reboot",
        message_id: "78c8e7c40f8ea16f8f82d06c841e1852",
        subject: "Rebooting into slot @UPDRAFT_SLOT@ for the trial of @UPDRAFT_RELEASE@",
        body: "The reboot command runs. If the new slot does not come up healthy, the \
               bootloader's try counter or the health checks bring the previous slot \
               back.",
    },
    EventKind {
        name: "trial-boot",
        message_id: "25cd3a238efdd5e9afc864cdc0610dfe",
        subject: "Booted slot @UPDRAFT_SLOT@ for the trial of @UPDRAFT_RELEASE@",
        body: "The device runs the new slot on trial; the health checks decide whether \
               it is committed or rolled back.",
    },
    EventKind {
        name: "committed",
        message_id: "304d0bcac2744e2e8adc8929fd0b186e",
        subject: "Committed release @UPDRAFT_RELEASE@ on slot @UPDRAFT_SLOT@",
        body: "The health checks passed and the slot is marked good: the bootloader \
               boots it from now on. The update is complete.",
    },
    EventKind {
        name: "rollback",
        message_id: "754e3cc5a752282eac47e549c78cbbda",
        subject: "Rolling back release @UPDRAFT_RELEASE@: @UPDRAFT_REASON@",
        body: "The release on trial failed (the reason says how) and the device \
               reboots into the previous slot. The failed release is not installed \
               again unless a newer manifest names it or an operator asks; look at the \
               health check logs in the state directory.",
    },
    EventKind {
        name: "rollback-retry",
        message_id: "048cb020cc64ba389b5034615212dbb3",
        subject: "Still on rejected slot @UPDRAFT_SLOT@: rebooting again",
        body: "After a rollback the device came up on the slot it rejected: the \
               bootloader did not follow the rollback. updraft reboots again; if this \
               repeats, check the bootloader's environment and the slot configuration.",
    },
    EventKind {
        name: "rolled-back",
        message_id: "0e1b440ee0ae18760548d75d07edcef3",
        subject: "Rolled back release @UPDRAFT_RELEASE@: @UPDRAFT_REASON@",
        body: "The device runs the previous slot again after the release failed its \
               trial. The reason is reported to the server; fix the release and \
               publish a newer one.",
    },
    EventKind {
        name: "failed",
        message_id: "a605ef5cfa2ecd939df288dff0033860",
        subject: "Failed to install release @UPDRAFT_RELEASE@: @UPDRAFT_REASON@",
        body: "The attempt ended before the device changed slot (a download, \
               verification or write that could not be completed); the active slot \
               is untouched. The next check tries again where the reason allows it.",
    },
    EventKind {
        name: "superseded",
        message_id: "33dbafbe29e4e415214e4d1d4599e784",
        subject: "Abandoned release @UPDRAFT_RELEASE@ for a newer one",
        body: "A newer release was published while this one was being installed; the \
               job in progress ended and the newer release is installed instead.",
    },
    EventKind {
        name: "cancelled",
        message_id: "3ee197f3862c241e92bc311bf4ef48b6",
        subject: "Cancelled release @UPDRAFT_RELEASE@",
        body: "An operator (`updraft cancel`) or the fleet server cancelled the job \
               before its reboot; the active slot is untouched and the release is not \
               installed again by itself.",
    },
    EventKind {
        name: "check-failed",
        message_id: "8d6e1a872ab8238f1bfdd9baac8b98d1",
        subject: "Could not check for updates: @UPDRAFT_REASON@",
        body: "A poll of the update server failed or its answer was refused (a \
               signature, an expiry, a serial or a hardware floor); nothing was \
               installed. Logged when the reason changes; look at the reason for \
               whether the server, the network or the release is at fault.",
    },
    EventKind {
        name: "check-interrupted",
        message_id: "0df1330b17501331092e361ec20381ce",
        subject: "Found a check interrupted by a restart",
        body: "A database written by an older updraft held a check in progress; it was \
               ended and the next poll checks again.",
    },
    EventKind {
        name: "running",
        message_id: "41410c5ae481ceb21246e0fa0846c7db",
        subject: "Found release @UPDRAFT_RELEASE@ already on slot @UPDRAFT_SLOT@",
        body: "A device fresh from the factory: the booted slot already holds the \
               release the manifest names (by its release marker or its hash), so \
               nothing is installed.",
    },
    EventKind {
        name: "adopted",
        message_id: "747bf0134fcfe4404bfa501054a3b733",
        subject: "Took this device over from another updater",
        body: "`updraft adopt` configured updraft from what RAUC or Mender knew of this \
               device; the device keeps its boot scripts and updraft writes their \
               variables with their owner's meaning.",
    },
    EventKind {
        name: "database-recovered",
        message_id: "48e8a17c9a794911f5aa1dcd97caf789",
        subject: "Rebuilt the damaged database",
        body: "updraft.db could not be used; it was moved aside and rebuilt from \
               protected.json (serial floors, accepted keys, rejected images). The \
               reports queued in the old database may be lost; the device keeps its \
               protection against older releases.",
    },
    EventKind {
        name: "degraded",
        message_id: "d4c033f4e5234a7eb058603fd301556b",
        subject: "Cannot start, running degraded: @UPDRAFT_REASON@",
        body: "Something a restart cannot cure (the configuration, the state \
               directory, the bootloader) keeps updraft from running updates. It \
               stays up, reports its state and tries again with a backoff; fix what \
               the reason names (`updraft status` shows it) and it recovers by itself.",
    },
];

/// The kind named `name`, if it is one.
pub fn kind(name: &str) -> Option<&'static EventKind> {
    KINDS.iter().find(|k| k.name == name)
}

/// The journal catalog of every kind, in systemd's catalog format (an
/// entry per `-- MESSAGE_ID` line: headers, a blank line, the text).
pub fn catalog() -> String {
    let mut out = String::from(
        "# updraft's journal catalog: what `journalctl -x` shows beside its messages.\n\
         # Installed as /usr/lib/systemd/catalog/updraft.catalog; made from\n\
         # agent/src/events.rs, which a test keeps this file equal to.\n",
    );
    for k in KINDS {
        out.push('\n');
        out.push_str(&format!("-- {}\n", k.message_id));
        out.push_str(&format!("Subject: {}\n", k.subject));
        out.push_str("Defined-By: updraft\n");
        out.push('\n');
        out.push_str(&wrap(&squeeze(k.body), 76));
    }
    out
}

/// Runs of spaces (from the source's line continuations) as one.
fn squeeze(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `text` broken into lines of at most `width` characters at spaces.
fn wrap(text: &str, width: usize) -> String {
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split(' ') {
        if !line.is_empty() && line.len() + 1 + word.len() > width {
            out.push_str(&line);
            out.push('\n');
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    out.push_str(&line);
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn every_kind_has_its_own_name_and_a_well_formed_id_of_its_own() {
        let mut names = HashSet::new();
        let mut ids = HashSet::new();
        for k in KINDS {
            assert!(names.insert(k.name), "{} listed twice", k.name);
            assert!(ids.insert(k.message_id), "{}'s id is another's", k.name);
            assert_eq!(k.message_id.len(), 32, "{}", k.name);
            assert!(
                k.message_id
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
                "{}: {}",
                k.name,
                k.message_id
            );
            assert!(!k.subject.contains('\n') && !k.subject.is_empty());
        }
    }

    /// The history event names that docs/cli.md lists all have a kind.
    #[test]
    fn the_documented_history_events_all_have_a_kind() {
        for name in [
            "check-failed",
            "download",
            "delta-fallback",
            "verify",
            "installed",
            "reboot",
            "trial-boot",
            "rollback",
            "rollback-retry",
            "rolled-back",
            "committed",
            "failed",
            "cancelled",
            "adopted",
            "running",
            "check-interrupted",
            "superseded",
            "database-recovered",
        ] {
            assert!(kind(name).is_some(), "{name} has no kind");
        }
        assert!(kind("idle").is_none());
    }

    #[test]
    fn the_catalog_in_the_tree_is_the_tables() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../systemd/updraft.catalog");
        let made = catalog();
        let kept = std::fs::read_to_string(path).unwrap_or_default();
        if kept != made {
            let fresh = std::env::temp_dir().join("updraft.catalog");
            let _ = std::fs::write(&fresh, &made);
            panic!(
                "{path} is not what agent/src/events.rs makes: copy {} over it",
                fresh.display()
            );
        }
    }

    #[test]
    fn catalog_entries_start_with_their_id_and_keep_lines_short() {
        let text = catalog();
        for k in KINDS {
            assert!(text.contains(&format!("\n-- {}\nSubject: ", k.message_id)));
        }
        for line in text.lines().filter(|l| !l.starts_with("Subject: ")) {
            assert!(line.len() <= 80, "{line}");
        }
    }
}
