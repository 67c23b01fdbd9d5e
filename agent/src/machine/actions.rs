//! The actions of the busy states: download, install, the trial boot, the
//! reboot and the health checks. Each runs once per step, after its state
//! was persisted, and is safe to run again after a power cut.

use super::*;

impl Machine {
    /// The download; a newer release found by a poll meanwhile supersedes
    /// the job instead.
    pub(super) fn download(&mut self, job: Job, t: &mut dyn Ticker) -> Result<Next> {
        let mut newer = None;
        let mut cancel = None;
        let r = self.transfer(job, t, &mut newer, &mut cancel);
        if let Some(c) = cancel {
            return self.server_cancelled(&c, t);
        }
        match newer {
            Some(v) => {
                let (origin, _) = match self.state()?.job() {
                    Some(j) => self.job_origin(j),
                    None => bail!(Store, "the superseded job is missing"),
                };
                self.supersede(&origin, v, t)?;
                Ok(Next::Continue)
            }
            None => r,
        }
    }

    fn transfer(
        &mut self,
        mut job: Job,
        t: &mut dyn Ticker,
        newer: &mut Option<Verified>,
        cancel: &mut Option<crate::ddi::Cancel>,
    ) -> Result<Next> {
        let m = self.job_manifest()?;
        let target = self.slots.path(job.target).to_path_buf();
        let booted = self.slots.path(self.booted).to_path_buf();
        let origin = Origin::parse(&job.source, &self.cfg.server.mirrors);
        if origin.is_remote() && self.fetcher.is_none() {
            self.fetcher = Some(Fetcher::new(&self.cfg)?);
        }
        let (size, received) = match &job.method {
            Method::Full => {
                let done = usize::try_from(job.frames_durable).unwrap_or(usize::MAX);
                let at = m.artifact.frames.get(done).map(|f| f.offset);
                (m.artifact.size, at.unwrap_or(m.artifact.size))
            }
            Method::Delta { url, .. } => {
                let d = job_delta(&m, url)?;
                let spool = spool_path(&self.cfg.system.state_dir, &d.sha256);
                let held = std::fs::metadata(spool).map(|md| md.len()).unwrap_or(0);
                (d.size, held.min(d.size))
            }
        };
        let deadline = watch::Deadline::of(&job, size, received, &self.cfg);
        let (polled, watched) = self.job_origin(&job);
        let reports = self
            .server
            .takes(report::CHECK_FAILED)
            .then_some((self.device_id.as_str(), self.booted));
        let preferred = self.preferred;
        let watch = (self.mode == Mode::Daemon && watched).then(|| watch::Watch {
            poller: Poller {
                store: &self.store,
                trust: &mut self.trust,
                fetcher: self.fetcher.as_ref(),
                preferred: &mut self.preferred,
                compatible: &self.cfg.device.compatible,
                channel: &self.channel.name,
                stale_limit: self.cfg.server.stale_limit.0,
            },
            origin: polled,
            version: job.version.clone(),
            image: job.image,
            reports,
            last_error: &mut self.last_error,
            last_check: &mut self.last_check,
            found: newer,
            pending: None,
        });
        let fleet = match (self.server.fleet().map(|f| &f.controller), &job.ddi) {
            (Some(c), Some(action)) if self.mode == Mode::Daemon => Some(fleet::FleetWatch {
                controller: c.clone(),
                store: &self.store,
                action: action.id.clone(),
                reported: None,
                pending: None,
                key: self.identity.key(),
                sending: None,
                send_after: None,
                found: cancel,
            }),
            _ => None,
        };
        let mut tick = watch::Tracker {
            inner: t,
            progress: &mut self.progress,
            deadline,
            watch,
            fleet,
        };
        let pref = match job.method.clone() {
            Method::Full => {
                let mut writer = SlotWriter::open(&target, &booted, self.cfg.system.sync_bytes)?;
                let frames = &m.artifact.frames;
                let start = if job.writing || job.frames_durable > 0 {
                    let hint = (job.frames_durable as usize).min(frames.len());
                    let start = install::probe_frames(&target, frames, hint, &mut tick)?;
                    log::info!(
                        "release {} slot {}: resuming at frame {start} of {} ({} frames were durable)",
                        job.version,
                        job.target,
                        frames.len(),
                        hint
                    );
                    start
                } else {
                    0
                };
                // The target leaves the boot order right before the first
                // byte is written to it, so a half-written slot can never
                // be booted, and a download that never starts leaves it be.
                let (boot, store, slot) = (&mut self.boot, &self.store, job.target);
                let mut writing_job = job.clone();
                writing_job.writing = true;
                let mut before_write = |t: &mut dyn Ticker| -> Result<()> {
                    boot.disable_with(slot, t)?;
                    store.forget_slot(slot)?;
                    store.update_state(&State::Downloading(writing_job.clone()))
                };
                let mut durable_job = job.clone();
                durable_job.writing = true;
                let mut on_durable = |n: u64| -> Result<()> {
                    durable_job.frames_durable = n;
                    store.update_state(&State::Downloading(durable_job.clone()))
                };
                let mut src = Source::new(origin, self.fetcher.clone(), preferred);
                let outcome = install::write_full(
                    &mut src,
                    &m,
                    &mut writer,
                    install::FullOptions {
                        start,
                        hash_image: !self.cfg.system.readback,
                        read_back: self.cfg.system.readback,
                    },
                    &mut tick,
                    install::WriteHooks {
                        before_write: &mut before_write,
                        on_durable: &mut on_durable,
                    },
                )?;
                writer.finish()?;
                job.frames_durable = frames.len() as u64;
                job.bytes_downloaded += outcome.bytes_read;
                job.stream_verified = outcome.hashed_in_stream && start == 0;
                job.read_back = outcome.read_back && start == 0;
                src.preferred()
            }
            Method::Delta { url, .. } => {
                let d = job_delta(&m, &url)?;
                let spool = spool_path(&self.cfg.system.state_dir, &d.sha256);
                let mut src = Source::new(origin, self.fetcher.clone(), preferred);
                let n = install::download_delta(&mut src, &d, &spool, &mut tick)?;
                job.bytes_downloaded += n;
                src.preferred()
            }
        };
        drop(tick);
        crate::poll::set_preferred(&self.store, &mut self.preferred, pref)?;
        let what = match job.method {
            Method::Full if job.read_back => "all frames written and read back from the slot",
            Method::Full => "all frames written; reading the slot back",
            Method::Delta { .. } => "delta downloaded and verified; applying it",
        };
        self.enter(State::Installing(job), "verify", Some(what), vec![])?;
        Ok(Next::Continue)
    }

    pub(super) fn install(&mut self, mut job: Job, t: &mut dyn Ticker) -> Result<Next> {
        let m = self.job_manifest()?;
        let target = self.slots.path(job.target).to_path_buf();
        let booted = self.slots.path(self.booted).to_path_buf();
        let mut tick = watch::Tracker {
            inner: t,
            progress: &mut self.progress,
            deadline: None,
            watch: None,
            fleet: None,
        };
        match job.method.clone() {
            Method::Full => {
                if !job.stream_verified || (self.cfg.system.readback && !job.read_back) {
                    install::verify_slot(&target, &m.image, &mut tick)?;
                }
            }
            Method::Delta { url, .. } => {
                let d = job_delta(&m, &url)?;
                let spool = spool_path(&self.cfg.system.state_dir, &d.sha256);
                let mut writer = SlotWriter::open(&target, &booted, self.cfg.system.sync_bytes)?;
                // Out of the boot order before the patch writes a byte.
                self.boot.disable_with(job.target, &mut tick)?;
                self.store.forget_slot(job.target)?;
                install::apply_delta(
                    &booted,
                    d.from_size,
                    &spool,
                    &m.image,
                    &mut writer,
                    &mut tick,
                )?;
                writer.finish()?;
                if self.cfg.system.readback {
                    install::verify_slot(&target, &m.image, &mut tick)?;
                }
                let _ = std::fs::remove_file(&spool);
            }
        }
        if !job.components.is_empty() {
            // The apps that change with the slot: written now, activated
            // in the trial boot.
            let (origin, _) = self.job_origin(&job);
            let mut records = std::mem::take(&mut job.components);
            let base = job.clone();
            self.write_records(
                &origin,
                &m.components,
                &job.version,
                &mut records,
                t,
                |mc, r| {
                    let mut j = base.clone();
                    j.components = r.to_vec();
                    mc.store.update_state(&State::Installing(j))
                },
            )?;
            job.components = records;
        }
        self.store.set_slot_record(&SlotRecord {
            slot: job.target,
            version: job.version.clone(),
            sha256: m.image.sha256,
            size: m.image.size,
            installed: Timestamp::now(),
        })?;
        job.installed = Some(Timestamp::now());
        job.boot_id = Some(self.boot_id.clone());
        job.purpose = Some(RebootPurpose::Trial);
        job.awaiting_switch = true;
        let how = match job.method {
            Method::Full => "verified on the slot (full image)",
            Method::Delta { .. } => "verified on the slot (delta)",
        };
        self.enter(State::Installed(job), "installed", Some(how), vec![])?;
        Ok(Next::Continue)
    }

    pub(super) fn installed(&mut self, mut job: Job, t: &mut dyn Ticker) -> Result<Next> {
        // The operator's policy first: a held slot waits here, checked by
        // nothing but polls, until its window or `updraft apply`.
        if let policy::Allowed::Later { recheck, .. } = self.hold(&mut job)? {
            if self.mode == Mode::Oneshot {
                return Ok(Next::Done);
            }
            return Ok(Next::Hold(recheck));
        }
        // Never switch on an expired promise: the slot goes first in the
        // boot order only while a valid manifest names its image.
        match self.promise(&job, t) {
            Ok(None) => {}
            Ok(Some(newer)) => {
                let (origin, _) = self.job_origin(&job);
                self.supersede(&origin, newer, t)?;
                return Ok(Next::Continue);
            }
            Err(e) if e.kind() == Kind::Stopped => return Err(e),
            Err(e) => {
                self.last_error = Some(e.to_string());
                if retry::retries_after(e.kind(), self.download_failures, self.mode == Mode::Daemon)
                {
                    self.download_failures = self.download_failures.saturating_add(1);
                    log::warn!(
                        "release {} slot {}: {e} (attempt {}; trying again later)",
                        job.version,
                        job.target,
                        self.download_failures
                    );
                    return Ok(Next::Retry(retry::delay(
                        e.retry_after(),
                        self.download_failures,
                        self.cfg.server.retry_max.0,
                    )));
                }
                let e = install::context(e, &job.version, job.target);
                let state = self.state()?;
                self.abandon(&state, job, &e.to_string(), "failed", t)?;
                return Err(e);
            }
        }
        self.download_failures = 0;
        if let Some(since) = job.held {
            // It waited (reboots and power cuts included): what is on the
            // medium now is what gets booted, so hash it again.
            let m = self.job_manifest()?;
            let target = self.slots.path(job.target).to_path_buf();
            log::info!(
                "release {} slot {}: held since {since}; verifying the slot again before the switch",
                job.version,
                job.target
            );
            if let Err(e) = install::verify_slot(&target, &m.image, t) {
                if e.kind() == Kind::Stopped {
                    return Err(e);
                }
                let e = install::context(e, &job.version, job.target);
                let state = self.state()?;
                self.abandon(
                    &state,
                    job,
                    &format!("{e} (re-verified after the hold)"),
                    "failed",
                    t,
                )?;
                return Err(e);
            }
        }
        self.boot.trial_with(job.target, self.tries(), t)?;
        let tries = self.trial_tries();
        log::info!(
            "release {} slot {}: first in the boot order for a trial boot ({tries} {})",
            job.version,
            job.target,
            if tries == 1 { "try" } else { "tries" }
        );
        if self.mode == Mode::Oneshot {
            if job.switch_pending() {
                // Switched: no longer held, and a boot of the old slot from
                // now on is a failed trial (see `Job::awaiting_switch`).
                job.held = None;
                job.awaiting_switch = false;
                self.store.update_state(&State::Installed(job))?;
            }
            return Ok(Next::Done);
        }
        job.boot_id = Some(self.boot_id.clone());
        job.purpose = Some(RebootPurpose::Trial);
        job.held = None;
        job.awaiting_switch = false;
        self.enter(
            State::Rebooting(job),
            "reboot",
            Some("into the new slot for its trial boot"),
            vec![],
        )?;
        Ok(Next::Continue)
    }

    pub(super) fn rebooting(&mut self, job: Job, t: &mut dyn Ticker) -> Result<Next> {
        if job.purpose == Some(RebootPurpose::Rollback) {
            self.boot.mark_bad_with(job.target, t)?;
            self.boot
                .mark_good_with(job.target.other(), self.tries(), t)?;
        }
        if self.mode == Mode::Oneshot {
            return Ok(Next::Done);
        }
        let into = match job.purpose {
            Some(RebootPurpose::Rollback) => job.target.other(),
            _ => job.target,
        };
        // A trial the reboot itself arms (the Raspberry Pi's tryboot flag)
        // gets the bootloader's argument; a rollback reboot never does.
        let reboot_command = self.reboot_command(job.purpose);
        match self.cfg.system.reboot {
            RebootMode::Auto if self.reboot_due_again() => {
                let asked = self.reboot_requested.map(|a| a.asks).unwrap_or(0);
                let since = self
                    .reboot_requested
                    .map(|a| a.at.elapsed())
                    .unwrap_or_default();
                let why = format!(
                    "the reboot into slot {into} asked {} ago has not come (the reboot command exited 0; asked {asked} time(s)): asking again",
                    crate::timestamp::format_duration(Duration::from_secs(since.as_secs()))
                );
                log::warn!("release {} slot {}: {why}", job.version, job.target);
                self.last_error = Some(why.clone());
                if self.server.takes(report::WAITING) {
                    let r = report::waiting(&self.device_id, self.booted, &job, "reboot", &why);
                    self.store.push_report(&r.as_report())?;
                }
                match run_reboot(&reboot_command, t) {
                    Ok(()) => {
                        self.reboot_requested = Some(RebootAsked {
                            at: std::time::Instant::now(),
                            asks: asked.saturating_add(1),
                        })
                    }
                    Err(e) => {
                        log::error!("release {} slot {}: {e}", job.version, job.target);
                        self.last_error = Some(e.to_string());
                    }
                }
            }
            RebootMode::Auto if self.reboot_requested.is_none() => {
                // An application may have become busy since the switch (a
                // logind lock, a file): the trial reboot waits for it. A
                // rollback reboot never does.
                if job.purpose != Some(RebootPurpose::Rollback) {
                    let mut held = job.clone();
                    let asked = self.inhibitors_allow(&mut held, State::Rebooting)?;
                    if let policy::Allowed::Later { recheck, why, wait } = asked {
                        self.note_wait(&held, wait, &format!("reboot held: {why}"))?;
                        return Ok(Next::Hold(recheck));
                    }
                    self.waiting = None;
                }
                log::info!(
                    "release {} slot {}: rebooting into slot {into}",
                    job.version,
                    job.target
                );
                match run_reboot(&reboot_command, t) {
                    Ok(()) => {
                        self.reboot_requested = Some(RebootAsked {
                            at: std::time::Instant::now(),
                            asks: 1,
                        })
                    }
                    // Asked again at the next step (the daemon steps a
                    // waiting reboot every few minutes).
                    Err(e) => {
                        log::error!("release {} slot {}: {e}", job.version, job.target);
                        self.last_error = Some(e.to_string());
                    }
                }
            }
            RebootMode::Manual if !self.waiting_logged => {
                self.waiting_logged = true;
                let how = match self.trial_argument(job.purpose) {
                    Some(arg) => format!(" with `reboot \"{arg}\"`"),
                    None => String::new(),
                };
                log::info!(
                    "release {} slot {}: waiting for an operator to reboot into slot {into}{how} (system.reboot = \"manual\")",
                    job.version,
                    job.target
                );
            }
            _ => {}
        }
        Ok(Next::WaitReboot)
    }

    pub(super) fn testing(&mut self, mut job: Job, t: &mut dyn Ticker) -> Result<Next> {
        if self.mode == Mode::Oneshot {
            bail!(
                Busy,
                "release {} in slot {} is under test: the daemon runs its health checks (or use updraft mark-good / mark-bad)",
                job.version,
                job.target
            );
        }
        if self.health.is_none()
            && job
                .components
                .iter()
                .any(|r| r.step == crate::state::Step::Written)
        {
            // The new slot booted: its apps' generations become active
            // before any health check runs.
            let mut records = std::mem::take(&mut job.components);
            let base = job.clone();
            let activated = self.activate_records(&job.version, &mut records, t, |m, r| {
                let mut j = base.clone();
                j.components = r.to_vec();
                m.store.update_state(&State::Testing(j))
            })?;
            job.components = records;
            if let Err(why) = activated {
                self.start_rollback(job, &why)?;
                return Ok(Next::Continue);
            }
        }
        if self.health.is_none() {
            let previous = self
                .store
                .slot_record(job.target.other())?
                .map(|r| r.version)
                .unwrap_or_default();
            let env = vec![
                ("UPDRAFT_SLOT".to_string(), job.target.as_str().to_string()),
                ("UPDRAFT_VERSION".to_string(), job.version.clone()),
                ("UPDRAFT_PREVIOUS_VERSION".to_string(), previous),
            ];
            self.health = Some(HealthRun::start(
                &self.cfg.health,
                &self.cfg.system.state_dir,
                env,
            )?);
            log::info!(
                "release {} slot {}: running health checks",
                job.version,
                job.target
            );
        }
        let progress = Progress {
            phase: "health".into(),
            ..Progress::default()
        };
        let verdict = loop {
            let Some(h) = self.health.as_mut() else {
                break Verdict::Fail("health run lost".into());
            };
            if let Some(v) = h.poll() {
                break v;
            }
            t.tick(&progress)?;
            // Asleep until the check exits, its time is up, or a client
            // calls; at least once a second for the status line.
            t.wait(h.wait_fd().as_slice(), h.until_limit().min(WAIT_SLICE))?;
        };
        self.health = None;
        let verdict = match verdict {
            Verdict::Pass if self.cfg.health.check_server => self.server_reachable(t),
            v => v,
        };
        let verdict = match verdict {
            Verdict::Pass => match self.records_healthy(&job.version, &job.components, t)? {
                Ok(()) => Verdict::Pass,
                Err(why) => Verdict::Fail(why),
            },
            v => v,
        };
        match verdict {
            Verdict::Pass => self.commit(job, "health checks passed", t),
            Verdict::Fail(reason) => {
                self.start_rollback(job, &reason)?;
                Ok(Next::Continue)
            }
        }
    }

    pub(super) fn server_reachable(&mut self, t: &mut dyn Ticker) -> Verdict {
        if let Some(c) = self.server.fleet().map(|f| f.controller.clone()) {
            return match crate::worker::offload("health", move || c.base().map(|_| ()), t) {
                Ok(Ok(())) => Verdict::Pass,
                Ok(Err(e)) | Err(e) => Verdict::Fail(format!("DDI server unreachable: {e}")),
            };
        }
        let Some(f) = self.fetcher.clone() else {
            return Verdict::Fail("health.check_server is set but no server is configured".into());
        };
        // Through the source, as a poll reads it (a bundle's manifest is
        // an entry read by Range requests, not the whole file).
        let origin = Origin::parse(&self.cfg.server.manifest_url, &self.cfg.server.mirrors);
        let preferred = self.preferred;
        let r = crate::worker::offload(
            "health",
            move || {
                Source::new(origin, Some(f), preferred)
                    .manifest(None)
                    .map(|_| ())
            },
            t,
        );
        match r {
            Ok(Ok(())) => Verdict::Pass,
            Ok(Err(e)) | Err(e) => Verdict::Fail(format!("update server unreachable: {e}")),
        }
    }
}

/// Where a delta is downloaded before it is applied.
pub(super) fn spool_path(state_dir: &std::path::Path, sha: &Sha256) -> std::path::PathBuf {
    state_dir.join(format!("delta-{}.partial", sha.short()))
}

/// Run the configured reboot command, bounded. On a stop the command goes
/// on (it is the reboot); this process does not wait for it.
impl Machine {
    /// The argument a reboot for `purpose` passes on: the bootloader's
    /// trial argument for a trial, nothing for a rollback.
    fn trial_argument(&self, purpose: Option<RebootPurpose>) -> Option<&'static str> {
        match purpose {
            Some(RebootPurpose::Rollback) => None,
            _ => self.boot.trial_reboot_argument(),
        }
    }

    /// The configured reboot command, with the trial's argument appended
    /// where the bootloader needs one (`systemctl reboot "0 tryboot"`).
    fn reboot_command(&self, purpose: Option<RebootPurpose>) -> Vec<String> {
        let mut cmd = self.cfg.system.reboot_command.clone();
        cmd.extend(self.trial_argument(purpose).map(String::from));
        cmd
    }
}

fn run_reboot(cmd: &[String], t: &mut dyn Ticker) -> Result<()> {
    run_bounded("reboot command", cmd, REBOOT_COMMAND_LIMIT, "reboot", t)
}

/// Run `cmd` (`what` names it in errors), bounded by `limit`. The wait
/// sleeps on the command's pidfd through the ticker, so the daemon keeps
/// answering; `phase` is the status line's.
pub(super) fn run_bounded(
    what: &str,
    cmd: &[String],
    limit: Duration,
    phase: &str,
    t: &mut dyn Ticker,
) -> Result<()> {
    let Some((prog, args)) = cmd.split_first() else {
        bail!(Config, "{what} is empty");
    };
    let mut cmd = std::process::Command::new(prog);
    crate::notify::scrub(&mut cmd);
    cmd.args(args).stdin(std::process::Stdio::null());
    let mut child =
        Watched::spawn(&mut cmd).map_err(|e| err!(Io, "starting {what} {prog}: {e}"))?;
    let progress = Progress {
        phase: phase.into(),
        ..Progress::default()
    };
    let finished = child
        .collect(limit, 0, &mut |fds, left| {
            t.tick(&progress)?;
            t.wait(fds, left.min(WAIT_SLICE))
        })
        .map_err(|f| match f {
            Failure::TimedOut(_) => err!(
                Io,
                "{what} {prog} did not finish within {} s",
                limit.as_secs()
            ),
            Failure::Read(e) | Failure::Wait(e) => err!(Io, "waiting for {what} {prog}: {e}"),
            Failure::Interrupted(e) => e,
        })?;
    if !finished.status.success() {
        bail!(Io, "{what} {prog} failed: {}", finished.status);
    }
    Ok(())
}
