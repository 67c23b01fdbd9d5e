//! What an operator asks of the machine (`mark-good`, `mark-bad`,
//! `cancel`), what it
//! reports on its own (heartbeats, the outbox) and the status view the
//! daemon serves (the one-shot CLI builds the same view in `cli/view.rs`).

use super::*;

/// The store key naming the image of the last cancelled job (its sha256):
/// polls leave it be until a manifest names another image.
pub(super) const CANCELLED_IMAGE: &str = "cancelled_image";

impl Machine {
    // ---- operator commands ----------------------------------------------------

    /// `updraft mark-good`: commit a slot under test, or re-mark the running
    /// slot good.
    pub fn mark_good(&mut self, t: &mut dyn Ticker) -> Result<String> {
        match self.state()? {
            State::Testing(job) => {
                self.health = None;
                let msg = format!(
                    "release {} in slot {} marked good by the operator",
                    job.version, job.target
                );
                self.commit(job, "marked good by the operator", t)?;
                Ok(msg)
            }
            s if !s.busy() => {
                self.boot.mark_good_with(self.booted, self.tries(), t)?;
                Ok(format!("slot {} marked good", self.booted))
            }
            s => bail!(Busy, "cannot mark good while {}", s.name()),
        }
    }

    /// `updraft mark-bad`: fail a slot under test (roll back), or cancel an
    /// installed release before its trial boot (as `updraft cancel`).
    pub fn mark_bad(&mut self, t: &mut dyn Ticker) -> Result<String> {
        match self.state()? {
            State::Testing(job) => {
                let msg = format!(
                    "release {} in slot {} marked bad; rolling back to slot {}",
                    job.version,
                    job.target,
                    job.target.other()
                );
                self.start_rollback(job, "marked bad by the operator")?;
                Ok(msg)
            }
            // Before the trial boot there is nothing to reject yet: the
            // update is cancelled.
            State::Installed(_) => self.cancel(t),
            State::Rebooting(job) if job.purpose != Some(RebootPurpose::Rollback) => self.cancel(t),
            s => bail!(
                Busy,
                "nothing to mark bad: no release is under test (state {})",
                s.name()
            ),
        }
    }

    /// `updraft cancel`: end the update in progress before its reboot.
    ///
    /// A download or an install stops where it was interrupted (the loop
    /// interrupts the step at its next tick, between frames or output
    /// blocks); the target is already out of the boot order if a byte was
    /// written, and nothing else changes. A written slot waiting to be
    /// switched is dropped. A slot already switched in but not yet
    /// rebooted into is switched back. Each ends as `cancelled`, and the
    /// image is not installed again until a manifest names another image
    /// or an operator runs `updraft install`. Once the trial boot has
    /// happened, cancel is `mark-bad`.
    pub fn cancel(&mut self, t: &mut dyn Ticker) -> Result<String> {
        self.stop_job(None, t)
    }

    /// End the update in progress before its reboot, for the operator
    /// (`by` is `None`) or for the DDI server's cancelAction. The server
    /// cannot stop a release past its switch: that is a `Busy` error, and
    /// the server is told `rejected`.
    pub(super) fn stop_job(
        &mut self,
        by: Option<&crate::ddi::Cancel>,
        t: &mut dyn Ticker,
    ) -> Result<String> {
        self.set_stopping(by.cloned());
        let r = self.stop_job_inner(t);
        self.set_stopping(None);
        r
    }

    fn stop_job_inner(&mut self, t: &mut dyn Ticker) -> Result<String> {
        let state = self.state()?;
        let name = state.name();
        match state {
            State::Downloading(job) | State::Installing(job) => {
                if let Method::Delta { url, .. } = &job.method {
                    if let Ok(d) = self.job_manifest().and_then(|m| job_delta(&m, url)) {
                        let _ =
                            std::fs::remove_file(spool_path(&self.cfg.system.state_dir, &d.sha256));
                    }
                }
                let what = if job.writing || name == "installing" {
                    "the partly written slot stays out of the boot order"
                } else {
                    "nothing was written"
                };
                let msg = cancelled_message(&job, what);
                self.end_cancelled(job, &format!("{name} stopped; {what}"))?;
                Ok(msg)
            }
            State::Installed(job) => {
                // A held slot was never switched: it has been out of the
                // boot order since its first write. One that is not held
                // may have been (a one-shot install stops here, switched
                // in): take it out again.
                let switched = job.held.is_none();
                self.drop_slot(
                    job,
                    switched,
                    t,
                    "the written slot is dropped and stays out of the boot order",
                    "the written slot was dropped before its switch",
                )
            }
            State::Rebooting(job) if job.purpose != Some(RebootPurpose::Rollback) => {
                if self.reboot_requested.is_some() {
                    bail!(
                        Busy,
                        "release {} slot {}: the reboot into it is under way; after the reboot, `updraft cancel` rejects it (mark-bad)",
                        job.version,
                        job.target
                    );
                }
                let what = format!("switched back to slot {}, no reboot", self.booted);
                self.drop_slot(job, true, t, &what, "switched back before the reboot")
            }
            State::Testing(job) if self.stopping().is_some() => bail!(
                Busy,
                "release {} slot {} is under its trial boot",
                job.version,
                job.target
            ),
            State::Testing(_) => self.mark_bad(t),
            s => bail!(
                Busy,
                "nothing to cancel (state {}): cancel stops an update before its reboot, or rejects the release under test",
                s.name()
            ),
        }
    }

    /// Cancel `job` whose slot is written: take the slot out of the boot
    /// order when it may be in it (`switched`), forget what it holds, and
    /// end the job as cancelled; `what` is told the operator, `detail`
    /// goes into history.
    fn drop_slot(
        &mut self,
        job: Job,
        switched: bool,
        t: &mut dyn Ticker,
        what: &str,
        detail: &str,
    ) -> Result<String> {
        if switched {
            self.boot.mark_bad_with(job.target, t)?;
        }
        self.store.forget_slot(job.target)?;
        let msg = cancelled_message(&job, what);
        self.end_cancelled(job, detail)?;
        Ok(msg)
    }

    /// The job ends as cancelled: its image is remembered so that polls do
    /// not start it again, then `failed` with a `cancelled` install result.
    fn end_cancelled(&mut self, job: Job, detail: &str) -> Result<()> {
        self.progress = None;
        self.health = None;
        self.apply_requested = None;
        let server = self.stopping().cloned();
        let reason = match &server {
            // The server decides again what the device runs: its image is
            // not held against a later action.
            Some(c) => format!(
                "cancelled by the DDI server (cancelAction {} for action {})",
                c.action_id, c.stop_id
            ),
            None => {
                self.store
                    .set(CANCELLED_IMAGE, &job.image.sha256.to_string())?;
                "cancelled by the operator".to_string()
            }
        };
        let detail = format!("{reason}: {detail}");
        let mut extra = vec![report::install_result(
            &self.device_id,
            self.booted,
            "cancelled",
            &job,
            Some(&detail),
        )];
        if let Some(c) = &server {
            extra.push(fleet::cancel_closed(
                c,
                format!("release {}: {detail}", job.version),
            ));
        }
        self.enter(
            State::Failed {
                reason,
                job: Some(job),
            },
            "cancelled",
            Some(&detail),
            extra,
        )
    }

    /// `updraft channel NAME`: follow `to` from now on (`None`: the
    /// configuration's channel again). The choice is stored on the data
    /// partition; the next poll fetches the new channel's manifest.
    pub fn choose_channel(&mut self, to: Option<&str>) -> Result<String> {
        let state = self.state()?;
        if state.busy() {
            bail!(
                Busy,
                "cannot change the channel while {} (finish or mark-bad the update first)",
                state.name()
            );
        }
        let target = match to {
            Some(name) => Followed {
                name: name.to_string(),
                source: "operator".into(),
            },
            None => Followed::configured(&self.server_template),
        };
        let mut server = self.server_template.clone();
        server.follow(&target.name)?;
        let from = self.channel.name.clone();
        self.store.choose_channel(&from, to, self.trust.version())?;
        self.cfg.server.manifest_url = server.manifest_url;
        self.cfg.server.mirrors = server.mirrors;
        let msg = if from == target.name {
            format!("following channel {} ({})", target.name, target.source)
        } else {
            format!(
                "following channel {} instead of {from} ({}); manifests from {}",
                target.name, target.source, self.cfg.server.manifest_url
            )
        };
        log::info!("{msg}");
        self.channel = target;
        Ok(msg)
    }

    /// Queue a heartbeat report.
    pub fn heartbeat(&mut self) -> Result<()> {
        if !self.server.takes(report::HEARTBEAT) {
            return Ok(());
        }
        let state = self.state()?;
        let running = self.store.slot_record(self.booted)?.map(|r| r.version);
        let r = report::heartbeat(&self.device_id, self.booted, &state, running.as_deref());
        self.store.push_report(&r.as_report())
    }

    /// Deliver queued reports, if a report URL is configured.
    pub fn deliver_reports(&mut self, t: &mut dyn Ticker) -> Result<usize> {
        self.server.deliver(
            &self.store,
            self.fetcher.as_ref(),
            &self.cfg.server,
            self.identity.key(),
            t,
        )
    }

    // ---- status -----------------------------------------------------------------

    /// The boot selection for the status view, or why it could not be
    /// read. This is the part of a status that may wait (an operator's
    /// script, a held lock); it waits through `t`.
    pub fn read_boot(&mut self, t: &mut dyn Ticker) -> BootView {
        self.boot.read_with(t).map_err(|e| e.to_string())
    }

    /// The status view: the store as it is now, with `boot` as the boot
    /// selection (see [`Machine::read_boot`]). Never waits for the
    /// bootloader.
    pub fn status(&mut self, boot: &BootView) -> Result<Status> {
        let (state, since) = self.store.state()?;
        let (boot, boot_err) = match boot {
            Ok(b) => (Some(b.clone()), None),
            Err(e) => (None, Some(e.clone())),
        };
        let slots = status::slots(&self.store, &self.slots, self.booted, boot.as_ref())?;
        let running = status::running_version(&slots, &self.cfg.device.release_file);
        Ok(Status {
            state: state.name().into(),
            since,
            device_id: self.device_id.clone(),
            identity: Some(self.identity.view()),
            encryption_key: crate::encrypt::device_key()
                .map(|k| crate::keys::encode_base64(&k.public())),
            booted_slot: self.booted,
            running_version: running,
            slots,
            next_boot: boot.as_ref().and_then(BootState::next_boot),
            bootloader_error: boot_err,
            job: state.job().cloned(),
            progress: self.progress.clone(),
            serial: self.store.serial()?,
            floor: self.store.floor(&self.channel.name, self.trust.version())?,
            keys_version: self.trust.version(),
            channel: Some(self.channel.clone()),
            last_check: self.last_check,
            next_check: self.next_check,
            last_error: self.last_error.clone(),
            outbox: self.store.outbox_len()?,
            outbox_dropped: self.store.outbox_dropped()?,
            last_install: status::last_install(&self.store)?,
            components: self.store.running_components()?,
            hardware_floor: self.floor_status(),
            policy: {
                let job = state.job();
                let pending = self.write_waiting.as_ref().filter(|_| job.is_none());
                let waiting = self
                    .waiting
                    .as_ref()
                    .filter(|(id, _)| job.is_some_and(|j| &j.id == id))
                    .map(|(_, w)| w.as_str())
                    .or(pending.map(|w| w.wait.as_str()));
                status::PolicyStatus::of(
                    &self.cfg.policy,
                    job,
                    pending.map(|w| w.version.as_str()),
                    waiting,
                    &self.inhibited_now,
                    Timestamp::now(),
                )
            },
        })
    }
}

/// What `updraft cancel` tells the operator about `job`.
fn cancelled_message(job: &Job, what: &str) -> String {
    format!(
        "release {} slot {}: cancelled; {what}",
        job.version, job.target
    )
}
