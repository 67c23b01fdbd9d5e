//! `updraft status` and `updraft history`: asking the daemon, or reading
//! the database and the bootloader when no daemon answers, and rendering
//! what they say for people (text) and scripts (`--json`).
//!
//! This file reads; it never writes the store or the bootloader.

use super::*;
use crate::progress::mib;
use crate::slot::SlotPair;
use crate::state::Method;
use crate::status::{self, LastInstall, Status};
use crate::timestamp::Timestamp;

pub(super) fn status(cfg: &Config, json: bool) -> Result<()> {
    let st = match control::try_request(&cfg.system.socket, &control::Request::Status)? {
        Some(reply) => reply
            .status
            .ok_or_else(|| err!(Io, "the daemon sent no status"))?,
        None => offline_status(cfg)?,
    };
    if json {
        let text =
            serde_json::to_string_pretty(&st).map_err(|e| err!(Io, "encoding status: {e}"))?;
        println!("{text}");
    } else {
        print!("{}", render_status(&st, Timestamp::now()));
    }
    Ok(())
}

/// Status from the database and bootloader, without a daemon.
fn offline_status(cfg: &Config) -> Result<Status> {
    let store = Store::open_for_reading(&cfg.db_path())?;
    let (state, since) = store.state()?;
    let booted = crate::bootloader::booted_slot(cfg)?;
    let (boot, boot_err) = match crate::bootloader::from_config(cfg).and_then(|mut b| b.read()) {
        Ok(b) => (Some(b), None),
        Err(e) => (None, Some(e.to_string())),
    };
    let pair = SlotPair {
        a: cfg.slots.a.clone(),
        b: cfg.slots.b.clone(),
    };
    let slots = status::slots(&store, &pair, booted, boot.as_ref())?;
    let device_id = std::fs::read_to_string(&cfg.device.id_file)
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let (trust, _) = crate::trust::Trust::restore(cfg.trust_anchor()?, &store.key_documents()?);
    let keys_version = trust.version();
    let channel = crate::channel::Followed::resolve(&cfg.server, &store)?;
    let last_error = match &state {
        State::Failed { reason, .. } => Some(reason.clone()),
        _ => store.get("last_check_error")?.filter(|e| !e.is_empty()),
    };
    Ok(Status {
        state: state.name().into(),
        since,
        device_id,
        identity: crate::device_key::inspect(&cfg.system.state_dir),
        encryption_key: crate::encrypt::inspect(&cfg.system.state_dir),
        booted_slot: booted,
        running_version: status::running_version(&slots, &cfg.device.release_file),
        slots,
        next_boot: boot.as_ref().and_then(|b| b.next_boot()),
        bootloader_error: boot_err,
        job: state.job().cloned(),
        progress: None,
        serial: store.serial()?,
        floor: store.floor(&channel.name, keys_version)?,
        keys_version,
        channel: Some(channel),
        last_check: None,
        next_check: None,
        last_error,
        outbox: store.outbox_len()?,
        outbox_dropped: store.outbox_dropped()?,
        last_install: status::last_install(&store)?,
        components: store.running_components()?,
        hardware_floor: crate::rollback_counter::from_config(&cfg.rollback).map(|mut c| {
            let reading = crate::rollback_counter::read_reading(c.as_mut());
            crate::status::HardwareFloor::of(
                c.describe(),
                &reading,
                cfg.rollback.on_unreadable,
                crate::rollback_counter::committed_security_version(&store),
            )
        }),
        policy: {
            // Without a daemon, what the job waits for is read from the
            // job as last written: no inhibitor is asked from here.
            let job = state.job();
            let waiting = job
                .filter(|j| j.held.is_some())
                .map(|j| crate::machine::Wait::of_held(j, cfg.policy.switch_gate().0).as_str());
            status::PolicyStatus::of(&cfg.policy, job, None, waiting, &[], Timestamp::now())
        },
    })
}

/// Human-readable status, with ages relative to `now`.
pub(crate) fn render_status(st: &Status, now: Timestamp) -> String {
    let mut out = String::new();
    let mut line = |k: &str, v: String| out.push_str(&format!("{k:<14}{v}\n"));
    line("state:", format!("{} (since {})", st.state, st.since));
    line(
        "booted slot:",
        format!(
            "{} ({})",
            st.booted_slot,
            st.running_version
                .as_deref()
                .map(|v| format!("release {v}"))
                .unwrap_or_else(|| "release unknown".into())
        ),
    );
    for s in &st.slots {
        let mut v = format!(
            "{}  {}",
            s.version.as_deref().unwrap_or("(no verified image)"),
            s.path
        );
        match (s.bootable, s.tries_left) {
            (Some(true), Some(t)) => v.push_str(&format!("  bootable, {t} tries left")),
            (Some(false), _) => v.push_str("  not bootable"),
            _ => {}
        }
        if st.next_boot == Some(s.slot) {
            v.push_str("  <- next boot");
        }
        line(&format!("slot {}:", s.slot), v);
    }
    for c in &st.components {
        let generation = c
            .generation
            .map(|g| format!(", generation {g}"))
            .unwrap_or_default();
        line(
            &format!("{} {}:", c.kind, c.name),
            format!("{} (release {}{generation})", c.version, c.release),
        );
    }
    if let Some(e) = &st.bootloader_error {
        line("bootloader:", format!("ERROR {e}"));
    }
    if let Some(j) = &st.job {
        let how = match &j.method {
            Method::Full => "full image".to_string(),
            Method::Delta { size, .. } => format!("delta {}", mib(*size)),
        };
        line(
            "job:",
            format!("release {} -> slot {} ({how})", j.version, j.target),
        );
        if let Some(a) = &j.ddi {
            let mut v = format!("DDI action {}", a.id);
            for (what, h) in [("download", a.download), ("update", a.update)] {
                if h != crate::ddi::Handling::Attempt {
                    v.push_str(&format!(
                        ", {what} {}",
                        match h {
                            crate::ddi::Handling::Skip => "skip",
                            crate::ddi::Handling::Forced => "forced",
                            crate::ddi::Handling::Attempt => "attempt",
                        }
                    ));
                }
            }
            match a.maintenance_window {
                Some(crate::ddi::MaintenanceWindow::Available) => {
                    v.push_str(", maintenance window open")
                }
                Some(crate::ddi::MaintenanceWindow::Unavailable) => {
                    v.push_str(", maintenance window closed")
                }
                None => {}
            }
            line("assigned by:", v);
        }
        if let Some(r) = &j.reason {
            line("reason:", r.clone());
        }
    }
    if let Some(p) = &st.progress {
        // Phases without a byte count (health checks, the reboot command)
        // have nothing to measure.
        let text = if p.total == 0 {
            format!("{} running", p.phase)
        } else {
            progress_line(p)
        };
        line("progress:", text);
    }
    if let Some(l) = &st.last_install {
        line("last install:", last_install_line(l, now));
    }
    if let Some(p) = &st.policy {
        let mut v = match &p.write {
            Some(w) => format!("write {w}, switch {}", p.switch),
            None => format!("switch {}", p.switch),
        };
        if let Some(r) = &p.pending_release {
            v.push_str(&format!(", release {r} waits to be downloaded"));
        }
        if let Some(t) = p.held_since {
            v.push_str(&format!(", verified slot held since {t}"));
        }
        match &p.window {
            Some(w) if w.open => v.push_str(&format!(", window open until {}", w.closes)),
            Some(w) => v.push_str(&format!(", next window {} – {}", w.opens, w.closes)),
            None => {}
        }
        line("policy:", v);
        if let Some(w) = &p.waiting_for {
            line("waiting for:", w.clone());
        }
        for i in &p.inhibitors {
            line("inhibited by:", i.describe());
        }
    }
    if let Some(t) = st.last_check {
        line("last check:", t.to_string());
    }
    if let Some(t) = st.next_check {
        line("next check:", t.to_string());
    }
    if let Some(e) = &st.last_error {
        line("last error:", e.clone());
    }
    line(
        "trust:",
        format!(
            "manifest serial {}, key document v{}",
            st.serial
                .map(|s| s.to_string())
                .unwrap_or_else(|| "none".into()),
            st.keys_version
        ),
    );
    if let Some(h) = &st.hardware_floor {
        line("hw floor:", h.describe());
    }
    if let Some(c) = &st.channel {
        let floor = match st.floor {
            Some(f) => format!("serial floor {f}"),
            None => "no serial floor yet".into(),
        };
        line(
            "channel:",
            format!("{} (chosen by the {}), {floor}", c.name, c.source),
        );
    }
    line("device id:", st.device_id.clone());
    if let Some(identity) = &st.identity {
        line("identity:", identity.line());
    }
    if let Some(k) = &st.encryption_key {
        line("encryption:", format!("x25519 {k}"));
    }
    line(
        "outbox:",
        if st.outbox_dropped > 0 {
            format!(
                "{} report(s) queued, {} dropped while it was full",
                st.outbox, st.outbox_dropped
            )
        } else {
            format!("{} report(s) queued", st.outbox)
        },
    );
    out
}

/// `release 1.2 rolled back in slot A at 2026-11-30T01:39:48Z (4 min ago): why`
fn last_install_line(l: &LastInstall, now: Timestamp) -> String {
    let result = match l.result.as_str() {
        "rolled_back" => "rolled back",
        other => other,
    };
    let mut s = format!("release {} {result}", l.release);
    if let Some(slot) = l.slot {
        s.push_str(&format!(" in slot {slot}"));
    }
    s.push_str(&format!(" at {}", l.time));
    if let Some(age) = ago(l.time, now) {
        s.push_str(&format!(" ({age})"));
    }
    if let Some(r) = &l.reason {
        s.push_str(&format!(": {r}"));
    }
    s
}

/// `42 s ago`, `5 min ago`, `3 h ago`, `2 days ago`; `None` for a time
/// after `now` (a clock that was stepped back).
fn ago(then: Timestamp, now: Timestamp) -> Option<String> {
    let s = now.0.checked_sub(then.0).filter(|s| *s >= 0)?;
    Some(match s {
        0..60 => format!("{s} s ago"),
        60..3600 => format!("{} min ago", s / 60),
        3600..172_800 => format!("{} h ago", s / 3600),
        _ => format!("{} days ago", s / 86_400),
    })
}

pub(super) fn history(cfg: &Config, json: bool) -> Result<()> {
    let store = Store::open_for_reading(&cfg.db_path())?;
    let entries = store.history(200)?;
    if json {
        let text = serde_json::to_string_pretty(&entries)
            .map_err(|e| err!(Io, "encoding history: {e}"))?;
        println!("{text}");
        return Ok(());
    }
    for e in entries {
        println!(
            "{}  {:<18} {:<10} {:<2} {}",
            e.time,
            e.event,
            e.release.as_deref().unwrap_or("-"),
            e.slot.as_deref().unwrap_or("-"),
            e.detail.as_deref().unwrap_or("")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::Progress;
    use crate::slot::SlotName;

    fn sample() -> Status {
        Status {
            state: "idle".into(),
            since: Timestamp(1_796_000_000),
            device_id: "d1".into(),
            identity: None,
            encryption_key: None,
            booted_slot: SlotName::A,
            running_version: Some("2.0".into()),
            slots: Vec::new(),
            next_boot: Some(SlotName::A),
            bootloader_error: None,
            job: None,
            progress: None,
            serial: Some(2),
            keys_version: 0,
            floor: None,
            channel: None,
            last_check: None,
            next_check: None,
            last_error: None,
            outbox: 0,
            outbox_dropped: 0,
            last_install: Some(LastInstall {
                release: "2.0".into(),
                result: "committed".into(),
                reason: Some("health checks passed".into()),
                time: Timestamp(1_796_000_000),
                slot: Some(SlotName::A),
            }),
            policy: None,
            components: Vec::new(),
            hardware_floor: None,
        }
    }

    #[test]
    fn the_hardware_floor_is_shown_with_its_counter_or_why_installs_stop() {
        use crate::config::OnUnreadable;
        use crate::rollback_counter::Reading;
        let now = Timestamp(1_796_000_100);
        assert!(line(&render_status(&sample(), now), "hw floor:").is_none());
        let tpm = || "tpm2 NV index 0x1500016".to_string();
        let rows = [
            (
                Reading::Value(5),
                OnUnreadable::Refuse,
                "hw floor:       5 (tpm2 NV index 0x1500016)",
            ),
            (
                Reading::Unreadable("no TPM".into()),
                OnUnreadable::Refuse,
                "hw floor:       UNREADABLE (tpm2 NV index 0x1500016): no TPM; installs refused",
            ),
            (
                Reading::Unreadable("no TPM".into()),
                OnUnreadable::Allow,
                "hw floor:       UNREADABLE (tpm2 NV index 0x1500016): no TPM; installs unchecked",
            ),
        ];
        for (reading, on, want) in rows {
            let mut st = sample();
            st.hardware_floor = Some(crate::status::HardwareFloor::of(
                tpm(),
                &reading,
                on,
                Some(5),
            ));
            let text = render_status(&st, now);
            let got = line(&text, "hw floor:").unwrap();
            assert_eq!(
                got.split_whitespace().collect::<Vec<_>>(),
                want.split_whitespace().collect::<Vec<_>>()
            );
        }
    }

    fn line<'a>(text: &'a str, key: &str) -> Option<&'a str> {
        text.lines().find(|l| l.starts_with(key))
    }

    #[test]
    fn status_shows_how_the_last_install_ended_and_when() {
        let mut st = sample();
        let t = st.last_install.as_ref().unwrap().time;
        let text = render_status(&st, Timestamp(t.0 + 300));
        assert_eq!(
            line(&text, "last install:"),
            Some(
                "last install: release 2.0 committed in slot A at 2026-11-30T00:53:20Z (5 min ago): health checks passed"
            ),
            "{text}"
        );
        st.last_install = Some(LastInstall {
            release: "3.0".into(),
            result: "rolled_back".into(),
            reason: Some("health check 20-payment failed (exit status: 1)".into()),
            time: t,
            slot: Some(SlotName::B),
        });
        let text = render_status(&st, Timestamp(t.0 + 7300));
        assert_eq!(
            line(&text, "last install:"),
            Some(
                "last install: release 3.0 rolled back in slot B at 2026-11-30T00:53:20Z (2 h ago): health check 20-payment failed (exit status: 1)"
            ),
            "{text}"
        );
        st.last_install = None;
        let text = render_status(&st, t);
        assert_eq!(line(&text, "last install:"), None, "{text}");
        // Every line keeps the value column, also the longest key.
        assert!(
            text.lines()
                .all(|l| l.len() > 14 && l.as_bytes()[13] == b' '),
            "{text}"
        );
    }

    #[test]
    fn status_shows_a_jobs_progress_with_rate_and_time_left() {
        let mut st = sample();
        st.state = "downloading".into();
        st.job = Some(crate::test_support::job_into(SlotName::B));
        st.progress = Some(Progress {
            phase: "download".into(),
            done: 3 * 1_048_576,
            total: 12 * 1_048_576,
            rate: 1_048_576,
            eta: Some(9),
        });
        let text = render_status(&st, st.since);
        assert_eq!(
            line(&text, "job:"),
            Some("job:          release 2.0 -> slot B (full image)")
        );
        assert_eq!(
            line(&text, "progress:"),
            Some("progress:     download 25% 3.0 MiB of 12.0 MiB, 1.0 MiB/s, 9 s left"),
            "{text}"
        );
        st.progress = Some(Progress {
            phase: "health".into(),
            ..Progress::default()
        });
        let text = render_status(&st, st.since);
        assert_eq!(
            line(&text, "progress:"),
            Some("progress:     health running")
        );
    }

    #[test]
    fn the_identity_line_shows_the_key_or_why_it_is_unusable() {
        use crate::device_key::IdentityView;
        let mut st = sample();
        assert_eq!(line(&render_status(&st, st.since), "identity:"), None);
        // (identity, the line shown)
        let cases = [
            (
                IdentityView {
                    public_key: Some("Gb9E=".into()),
                    keyid: Some("ab".into()),
                    unusable: None,
                },
                "identity:     ed25519 Gb9E=",
            ),
            (
                IdentityView {
                    unusable: Some(
                        "device key /d/device-key.pem: no PEM PRIVATE KEY block found".into(),
                    ),
                    ..IdentityView::default()
                },
                "identity:     unusable: device key /d/device-key.pem: no PEM PRIVATE KEY block found",
            ),
        ];
        for (identity, want) in cases {
            st.identity = Some(identity);
            let text = render_status(&st, st.since);
            assert_eq!(line(&text, "identity:"), Some(want), "{text}");
        }
    }

    #[test]
    fn ages_read_like_a_person_says_them() {
        let at = |s: i64| ago(Timestamp(1000), Timestamp(1000 + s));
        assert_eq!(at(0).as_deref(), Some("0 s ago"));
        assert_eq!(at(59).as_deref(), Some("59 s ago"));
        assert_eq!(at(60).as_deref(), Some("1 min ago"));
        assert_eq!(at(3599).as_deref(), Some("59 min ago"));
        assert_eq!(at(3600).as_deref(), Some("1 h ago"));
        assert_eq!(at(47 * 3600).as_deref(), Some("47 h ago"));
        assert_eq!(at(3 * 86_400).as_deref(), Some("3 days ago"));
        assert_eq!(at(-5), None);
    }

    #[test]
    fn last_install_in_the_wire_form_is_additive() {
        let st = sample();
        let v = serde_json::to_value(&st).unwrap();
        assert_eq!(
            v["last_install"],
            serde_json::json!({
                "release": "2.0",
                "result": "committed",
                "reason": "health checks passed",
                "time": "2026-11-30T00:53:20Z",
                "slot": "A",
            })
        );
        // A daemon without the field (older), and one with fields this
        // version does not know (newer), are both understood.
        let mut old = v.clone();
        old.as_object_mut().unwrap().remove("last_install");
        let parsed: Status = serde_json::from_value(old).unwrap();
        assert_eq!(parsed.last_install, None);
        let mut new = v.clone();
        new["last_install"]["duration_s"] = serde_json::json!(42);
        new["future_field"] = serde_json::json!({"x": 1});
        let parsed: Status = serde_json::from_value(new).unwrap();
        assert_eq!(parsed.last_install, st.last_install);
        // Without the optional parts, they are left out.
        let mut bare = sample();
        bare.last_install = Some(LastInstall {
            reason: None,
            slot: None,
            ..st.last_install.clone().unwrap()
        });
        let v = serde_json::to_value(&bare).unwrap();
        assert_eq!(
            v["last_install"],
            serde_json::json!({"release": "2.0", "result": "committed", "time": "2026-11-30T00:53:20Z"})
        );
    }
}
