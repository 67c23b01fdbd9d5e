//! Checking for a release: a verified manifest from [`crate::poll`], then
//! the device's own decision (already running, being installed, rejected
//! before, outside the rollout) and the plan of the job: which slot, which
//! method. Only a job that starts is written.

use super::verdict::{Booted, Facts, InProgress, Verdict, verdict};
use super::*;

/// The job's manifest of version 2 as signed (its components), beside
/// `job_manifest`.
const JOB_MANIFEST_COMPONENTS: &str = "job_manifest_components";

impl Machine {
    // ---- checking -------------------------------------------------------------

    /// Look for a release at `origin` (the configured server when `None`)
    /// and start installing it when it is new and applies. `operator` marks
    /// an explicit install: rollout and earlier rejections do not apply.
    pub fn check(
        &mut self,
        origin: Option<Origin>,
        operator: bool,
        t: &mut dyn Ticker,
    ) -> Result<CheckOutcome> {
        if origin.is_none() && self.fleet_mode() {
            self.last_check = Some(Timestamp::now());
            let result = self.check_fleet(t);
            if let Some(why) = result.as_ref().ok().and_then(CheckOutcome::why) {
                log::info!("check: {why}");
            }
            note_check(
                &self.store,
                result.as_ref().map(|_| ()),
                None,
                &mut self.last_error,
            )?;
            return result;
        }
        let default_origin = origin.is_none();
        let origin = match origin {
            Some(o) => o,
            None => {
                if self.cfg.server.manifest_url.is_empty() {
                    bail!(Config, "server.manifest_url is not set: nothing to poll");
                }
                Origin::parse(&self.cfg.server.manifest_url, &self.cfg.server.mirrors)
            }
        };
        if origin.is_remote() && self.fetcher.is_none() {
            self.fetcher = Some(Fetcher::new(&self.cfg)?);
        }
        self.last_check = Some(Timestamp::now());
        let state = self.state()?;
        // Checking is not persisted: a check that finds nothing to do
        // writes nothing (an idle poll costs no flash writes); only what a
        // check leads to is recorded.
        log::debug!("checking {}", origin.to_arg());
        let result = self.check_inner(&origin, default_origin, operator, &state, t);
        if let Some(why) = result.as_ref().ok().and_then(CheckOutcome::why) {
            log::info!("check: {why}");
        }
        let reports = self
            .server
            .takes(report::CHECK_FAILED)
            .then_some((self.device_id.as_str(), self.booted));
        note_check(
            &self.store,
            result.as_ref().map(|_| ()),
            reports,
            &mut self.last_error,
        )?;
        result
    }

    pub(super) fn check_inner(
        &mut self,
        origin: &Origin,
        default_origin: bool,
        operator: bool,
        state: &State,
        t: &mut dyn Ticker,
    ) -> Result<CheckOutcome> {
        let mut poller = self.poller();
        let verified = match poller.verified_manifest(origin, default_origin, t)? {
            Polled::Verified(v) => *v,
            Polled::Stale(why) => return Ok(CheckOutcome::NoChange(why)),
        };
        self.decide(origin, operator, state, verified, t)
    }

    /// What a verified manifest leads to in `state`. A job that has not
    /// switched slots yet and came from the configured server is
    /// superseded by a manifest naming another image.
    pub(super) fn decide(
        &mut self,
        origin: &Origin,
        operator: bool,
        state: &State,
        verified: Verified,
        t: &mut dyn Ticker,
    ) -> Result<CheckOutcome> {
        let m = &verified.manifest;
        self.write_waiting = None;
        let in_progress = state.job().filter(|_| state.busy()).map(|job| InProgress {
            job,
            state: state.name(),
            supersedable: self.supersedable(state, origin),
        });
        let mut booted = match self.store.slot_record(self.booted)? {
            Some(r) => Booted::Recorded(r.sha256, r.size),
            None => Booted::Unrecorded,
        };
        let rejected = self.store.rejected(&m.image.sha256)?;
        let cancelled = self.store.get(operator::CANCELLED_IMAGE)?.as_deref()
            == Some(m.image.sha256.to_hex().as_str());
        let rollout = m.release.rollout.as_ref().map(|r| {
            let chosen = rollout::eligible(&self.device_id, &m.release.version, r.percent);
            (r.percent, chosen)
        });
        let (unreject, uncancel) = loop {
            let facts = Facts {
                version: &m.release.version,
                serial: m.serial,
                image: (m.image.sha256, m.image.size),
                freshness: verified.freshness,
                operator,
                in_progress,
                booted_slot: self.booted,
                booted,
                rejected: rejected.as_deref(),
                cancelled,
                rollout,
            };
            match verdict(&facts) {
                Verdict::NoChange(why) => return Ok(CheckOutcome::NoChange(why)),
                Verdict::Supersede => return self.supersede(origin, verified, t),
                Verdict::Busy(why) => bail!(Busy, "{why}"),
                Verdict::Running(why) => {
                    return self.running_slot(origin, operator, m, why, t);
                }
                Verdict::Declined(why) => return Ok(CheckOutcome::Declined(why)),
                Verdict::Probe => match self.provisioned(m, t)? {
                    Some(how) => {
                        let why = format!(
                            "release {} is already running in slot {} ({how}); nothing to install",
                            m.release.version, self.booted
                        );
                        return self.running_slot(origin, operator, m, why, t);
                    }
                    None => booted = Booted::NotThisImage,
                },
                Verdict::Install { unreject, uncancel } => break (unreject, uncancel),
            }
        };
        // Before anything about the install is written.
        self.gate_install(m)?;
        self.gate_provenance(origin, m, t)?;
        if unreject {
            log::info!(
                "release {}: installing again on operator request despite an earlier rollback",
                m.release.version
            );
            self.store.unreject(&m.image.sha256)?;
        }
        if uncancel {
            log::info!(
                "release {}: installing on operator request after an earlier cancel",
                m.release.version
            );
            self.store.set(operator::CANCELLED_IMAGE, "")?;
        }
        if !operator {
            if let Some(why) = self.write_held(&m.release.version) {
                return Ok(CheckOutcome::Held(why));
            }
        }
        self.plan(origin, m, t)
    }

    /// With no install recorded for the booted slot, whether it already
    /// holds `m`'s image ([`crate::provision`]): by its release marker, or
    /// else by hashing it, at most once per slot and image. When it does,
    /// the release is recorded as running and reported, and what showed it
    /// is returned.
    fn provisioned(&mut self, m: &Manifest, t: &mut dyn Ticker) -> Result<Option<String>> {
        let marker_path = self.cfg.device.release_file.clone();
        let version = &m.release.version;
        let how = match crate::provision::read_marker(&marker_path) {
            Ok(Some(marker)) => {
                if marker.version != *version {
                    log::debug!(
                        "release marker {} names release {}, the manifest {version}",
                        marker_path.display(),
                        marker.version
                    );
                    return Ok(None);
                }
                if marker.sha256.is_some_and(|s| s != m.image.sha256) {
                    log::warn!(
                        "release marker {} names release {version} with another image than the manifest's {}; installing it",
                        marker_path.display(),
                        m.image.sha256.short()
                    );
                    return Ok(None);
                }
                format!("its release marker {} names it", marker_path.display())
            }
            Ok(None) => match self.booted_holds(m, t)? {
                true => format!("its first {} bytes hash to the signed image", m.image.size),
                false => return Ok(None),
            },
            Err(e) => {
                log::warn!("{e}; the release in slot {} is not known", self.booted);
                return Ok(None);
            }
        };
        let mut reports = Vec::new();
        if self.server.takes(report::RUNNING) {
            reports.push(report::running(
                &self.device_id,
                self.booted,
                version,
                &m.image.sha256,
                &how,
            ));
        }
        let booted = self.booted;
        self.store.atomically(|s| {
            s.set_slot_record(&SlotRecord {
                slot: booted,
                version: version.clone(),
                sha256: m.image.sha256,
                size: m.image.size,
                installed: Timestamp::now(),
            })?;
            s.add_history(&Event {
                event: "running",
                release: Some(version),
                slot: Some(booted),
                detail: Some(&format!("no install recorded; {how}")),
            })?;
            for r in &reports {
                s.push_report(&r.as_report())?;
            }
            Ok(())
        })?;
        let slot = booted.to_string();
        crate::logging::event(
            log::Level::Info,
            &crate::logging::EventFields {
                event: "running",
                release: Some(version),
                slot: Some(&slot),
                reason: Some(&how),
                ..Default::default()
            },
            format_args!("running: release {version} slot {booted}: no install recorded; {how}"),
        );
        Ok(Some(how))
    }

    /// Whether the booted slot's first `image.size` bytes are `m`'s image,
    /// compared frame by frame with its signed frame table (stopping at the
    /// first frame that differs) once per slot and image: the verdict is
    /// kept in the store
    /// (`booted_hash.<slot>`). A slot that cannot be read holds nothing
    /// known.
    fn booted_holds(&mut self, m: &Manifest, t: &mut dyn Ticker) -> Result<bool> {
        let key = format!("booted_hash.{}", self.booted);
        let image = m.image.sha256.to_hex();
        if let Some(cached) = self.store.get(&key)? {
            if let Some((sha, verdict)) = cached.split_once(' ') {
                if sha == image {
                    return Ok(verdict == "same");
                }
            }
        }
        log::info!(
            "slot {}: no install recorded; hashing its first {} bytes for release {} (frame by frame, stopping at the first that differs)",
            self.booted,
            m.image.size,
            m.release.version
        );
        let path = self.slots.path(self.booted);
        let same = match crate::provision::booted_slot_holds(path, &m.artifact.frames, t) {
            Ok(same) => same,
            Err(e) if e.kind() == Kind::Stopped => return Err(e),
            Err(e) => {
                log::warn!("slot {}: {e}; its release is not known", self.booted);
                return Ok(false);
            }
        };
        let verdict = if same { "same" } else { "differs" };
        self.store.set(&key, &format!("{image} {verdict}"))?;
        Ok(same)
    }

    /// Choose target slot and method, and start the job.
    pub(super) fn plan(
        &mut self,
        origin: &Origin,
        m: &Manifest,
        t: &mut dyn Ticker,
    ) -> Result<CheckOutcome> {
        // A component this device cannot install refuses the release
        // before a byte of the slot is written.
        let components = self.slot_job_components(m)?;
        let target = self.booted.other();
        let target_path = self.slots.path(target).to_path_buf();
        let booted_path = self.slots.path(self.booted).to_path_buf();
        if slot::same_slot(&target_path, &booted_path)? {
            bail!(
                Slot,
                "slot {target} ({}) is the same device as the booted slot {} ({}): refusing to write it",
                target_path.display(),
                self.booted,
                booted_path.display()
            );
        }
        let capacity = slot::capacity(&target_path)?;
        if m.image.size > capacity {
            bail!(
                Slot,
                "release {} image is {} bytes, slot {target} ({}) holds only {capacity}",
                m.release.version,
                m.image.size,
                target_path.display()
            );
        }
        let mut method = Method::Full;
        let mut hashed: Vec<(u64, Option<Sha256>)> = Vec::new();
        for d in &m.deltas {
            let h = match hashed.iter().find(|(len, _)| *len == d.from_size) {
                Some((_, h)) => *h,
                None => {
                    let h = install::hash_slot_prefix(&booted_path, d.from_size, t)?;
                    hashed.push((d.from_size, h));
                    h
                }
            };
            if h == Some(d.from_sha256) {
                method = Method::Delta {
                    url: d.url.clone(),
                    size: d.size,
                };
                break;
            }
        }
        if !m.deltas.is_empty() && method == Method::Full {
            log::info!(
                "release {}: no delta matches the contents of slot {}; using the full image",
                m.release.version,
                self.booted
            );
        }
        let mut job = Job::new(
            report::new_key(),
            m.release.version.clone(),
            m.serial,
            m.image,
            origin.to_arg(),
            target,
            method.clone(),
        );
        let size = match &method {
            Method::Full => m.artifact.size,
            Method::Delta { size, .. } => *size,
        };
        job.components = components;
        job.download_deadline = Some(job.started.plus(self.cfg.download_time(size)));
        job.ddi = self.server.fleet_mut().and_then(|f| f.action.take());
        if method == Method::Full {
            let kept = self.store.partial_write(target)?;
            if let Some(frames) = resume_after(kept, &m.artifact) {
                // An earlier job left these frames of the same artifact on
                // the slot: the next ones are checked on the slot, and the
                // whole image once written.
                job.writing = true;
                job.frames_durable = frames;
                log::info!(
                    "release {} slot {target}: {frames} of {} frames are on the slot from an earlier attempt; the download goes on after them",
                    m.release.version,
                    m.artifact.frames.len()
                );
            }
        }
        // `job_manifest` keeps the shape of version 1, which releases
        // before components read; the components go beside it.
        let payload =
            serde_json::to_string(m).map_err(|e| err!(Store, "encoding manifest: {e}"))?;
        let with_components = match m.slot {
            Some(_) => String::from_utf8(
                crate::manifest::component::to_payload(m)
                    .map_err(|e| err!(Store, "encoding manifest: {e}"))?,
            )
            .map_err(|e| err!(Store, "encoding manifest: {e}"))?,
            None => String::new(),
        };
        self.store.atomically(|s| {
            s.set("job_manifest", &payload)?;
            s.set(JOB_MANIFEST_COMPONENTS, &with_components)
        })?;
        let how = match &method {
            Method::Full => format!("full image, {} bytes", m.artifact.size),
            Method::Delta { size, .. } => format!("delta, {size} bytes"),
        };
        self.download_failures = 0;
        self.enter(State::Downloading(job), "download", Some(&how), vec![])?;
        Ok(CheckOutcome::Started {
            version: m.release.version.clone(),
            target,
            delta: matches!(method, Method::Delta { .. }),
        })
    }

    /// The poller of this machine: the one place a [`Poller`] is made
    /// from its store, trust, transport and configuration.
    pub(super) fn poller(&mut self) -> Poller<'_> {
        Poller {
            store: &self.store,
            trust: &mut self.trust,
            fetcher: self.fetcher.as_ref(),
            preferred: &mut self.preferred,
            compatible: &self.cfg.device.compatible,
            channel: &self.channel.name,
            stale_limit: self.cfg.server.stale_limit.0,
        }
    }

    pub(super) fn job_manifest(&self) -> Result<Manifest> {
        let text = self.store.get("job_manifest")?.ok_or_else(|| {
            err!(
                Store,
                "the manifest of the current job is missing from the database"
            )
        })?;
        let m: Manifest = serde_json::from_slice(text.as_bytes())
            .map_err(|e| err!(Store, "stored job manifest is unreadable: {e}"))?;
        // The components, when this release stored them for this very
        // manifest (a release before components stores none, and may
        // have replaced the job since).
        let Some(v2) = self
            .store
            .get(JOB_MANIFEST_COMPONENTS)?
            .filter(|t| !t.is_empty())
        else {
            return Ok(m);
        };
        match Manifest::parse(v2.as_bytes()) {
            Ok(full) if full.serial == m.serial && full.image == m.image => Ok(full),
            Ok(_) => Ok(m),
            Err(e) => Err(e.wrap("stored job manifest with components")),
        }
    }
}

/// Where a new job writing `artifact` starts, given what an earlier one
/// left on the slot (`kept`: that artifact's sha256 and its durable
/// frames): after those frames when it is the same artifact and they are
/// not all of it, else nowhere but frame 0 (`None`).
pub(super) fn resume_after(
    kept: Option<(Sha256, u64)>,
    artifact: &crate::manifest::Artifact,
) -> Option<u64> {
    let (sha, frames) = kept?;
    (sha == artifact.sha256 && frames > 0 && frames < artifact.frames.len() as u64)
        .then_some(frames)
}

/// Bookkeeping of a check that ended: a failure is recorded (history line
/// and report once per reason, see [`crate::poll::record_failure`]) and
/// shown in status; a success clears both.
pub(super) fn note_check(
    store: &Store,
    result: std::result::Result<(), &Error>,
    reports: Option<(&str, SlotName)>,
    last_error: &mut Option<String>,
) -> Result<()> {
    match result {
        Err(e) => {
            *last_error = Some(e.to_string());
            crate::poll::record_failure(store, e, reports)
        }
        Ok(()) => {
            if store
                .get("last_check_error")?
                .is_some_and(|e| !e.is_empty())
            {
                store.set("last_check_error", "")?;
            }
            *last_error = None;
            Ok(())
        }
    }
}

/// The delta a job's method names (by its URL), from the job's manifest.
pub(super) fn job_delta(m: &Manifest, url: &str) -> Result<manifest::Delta> {
    m.deltas
        .iter()
        .find(|d| d.url == url)
        .cloned()
        .ok_or_else(|| err!(Store, "the job's delta {url} is not in its manifest"))
}

#[cfg(test)]
mod tests {
    use super::resume_after;
    use crate::hash::Sha256;
    use crate::manifest::{Artifact, Frame};

    fn artifact(frames: u64) -> Artifact {
        Artifact {
            url: "a.zst".into(),
            size: frames * 100,
            sha256: Sha256::of(b"artifact"),
            frames: (0..frames)
                .map(|i| Frame {
                    offset: i * 100,
                    size: 100,
                    out_size: 400,
                    out_sha256: Sha256::of(&i.to_le_bytes()),
                })
                .collect(),
        }
    }

    #[test]
    fn a_new_job_resumes_only_after_durable_frames_of_the_same_artifact() {
        let a = artifact(10);
        let same = Sha256::of(b"artifact");
        let other = Sha256::of(b"another artifact");
        // What an earlier job kept, where the new one starts, why.
        type Row<'a> = (Option<(Sha256, u64)>, Option<u64>, &'a str);
        let rows: &[Row] = &[
            (None, None, "nothing kept"),
            (
                Some((same, 4)),
                Some(4),
                "the same artifact, 4 of 10 frames",
            ),
            (Some((same, 9)), Some(9), "all but the last frame"),
            (Some((same, 0)), None, "no frame durable"),
            (
                Some((same, 10)),
                None,
                "every frame: the job failed after the write",
            ),
            (Some((same, 11)), None, "more frames than the artifact has"),
            (Some((other, 4)), None, "another artifact of the same image"),
        ];
        for (kept, want, why) in rows {
            assert_eq!(resume_after(*kept, &a), *want, "{why}");
        }
    }
}
