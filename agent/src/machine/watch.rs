//! Keeping a long job honest: its total download deadline, polls for a
//! newer release while it downloads, and a currently valid manifest before
//! the slot switch.
//!
//! * **Deadline.** A job's download must end by `download_deadline`, set
//!   from the signed size when the download starts
//!   ([`crate::config::Config::download_time`]). Past it the download is
//!   abandoned (a network failure that `guard` does not retry), so a
//!   server that trickles bytes just above the rate floor cannot hold a
//!   job for weeks.
//! * **Polls meanwhile.** While a job from the configured server downloads,
//!   the driver's poll timer still runs ([`Ticker::poll_due`]): the
//!   manifest is fetched on a helper thread while frames keep arriving,
//!   then verified here as any poll is. The same image changes nothing; a
//!   failed poll is recorded and the download goes on; another image
//!   supersedes the job ([`Machine::supersede`]).
//! * **Promise.** Right before the switch the job's manifest must still be
//!   valid; an expired one is fetched again ([`Machine::promise`]), and
//!   only a valid manifest naming the same image lets the switch happen.
//!
//! This module never writes the slot or decides a transition the table in
//! `mod.rs` does not list: abandoning a job is `fail`, starting the newer
//! one is `decide`.

use super::*;
use crate::fetch::Fetched;
use crate::worker::Background;

/// A job's download deadline, checked at every tick of its download.
pub(super) struct Deadline {
    at: Timestamp,
    size: u64,
    /// Bytes of the artifact (or delta) held so far.
    received: u64,
    allowance: Duration,
    /// The average rate counted with, and the key it comes from.
    rate: u64,
    rate_key: &'static str,
}

impl Deadline {
    /// The deadline of `job`'s download of `size` bytes, of which
    /// `received` are already held; `None` for a job an older version of
    /// updraft started (it has none).
    pub(super) fn of(
        job: &Job,
        size: u64,
        received: u64,
        cfg: &crate::config::Config,
    ) -> Option<Deadline> {
        let (rate, rate_key) = cfg.download_rate();
        Some(Deadline {
            at: job.download_deadline?,
            size,
            received,
            allowance: cfg.server.download_allowance.0,
            rate,
            rate_key,
        })
    }

    /// Fails once the deadline has passed.
    pub(super) fn check(&mut self, p: &Progress) -> Result<()> {
        if p.phase == "download" {
            self.received = p.done;
        }
        let now = Timestamp::now();
        if now < self.at {
            return Ok(());
        }
        Err(err!(
            Network,
            "download abandoned at its deadline {}: {} of {} bytes received (deadline: server.download_allowance {} + {} bytes at {} {} bytes/s; slow retrieval)",
            self.at,
            self.received,
            self.size,
            crate::timestamp::format_duration(self.allowance),
            self.size,
            self.rate_key,
            self.rate
        )
        .with_cause(Cause::Deadline))
    }
}

/// The error that ends a download superseded by `v`.
fn superseded(v: &Verified) -> Error {
    Error::new(
        Kind::Stopped,
        format!(
            "superseded by release {} serial {}",
            v.manifest.release.version, v.manifest.serial
        ),
    )
}

/// Polls the configured server while a job downloads.
pub(super) struct Watch<'a> {
    pub(super) poller: Poller<'a>,
    pub(super) origin: Origin,
    /// The job's release and image.
    pub(super) version: String,
    pub(super) image: crate::manifest::Image,
    pub(super) reports: Option<(&'a str, SlotName)>,
    pub(super) last_error: &'a mut Option<String>,
    pub(super) last_check: &'a mut Option<Timestamp>,
    /// Where a manifest naming another image is left for the caller.
    pub(super) found: &'a mut Option<Verified>,
    pub(super) pending: Option<Background<(Result<Fetched>, usize)>>,
}

impl Watch<'_> {
    /// Start a poll when the driver's timer says so, look at one that
    /// runs, and end the download once a newer release was found.
    pub(super) fn tick(&mut self, t: &mut dyn Ticker) -> Result<()> {
        if let Some(v) = self.found.as_ref() {
            return Err(superseded(v));
        }
        let Some(call) = self.pending.as_ref() else {
            if t.poll_due() {
                self.start(t);
            }
            return Ok(());
        };
        match call.result() {
            Ok(None) => Ok(()),
            Ok(Some((answer, preferred))) => {
                self.pending = None;
                self.evaluate(answer, preferred, t)
            }
            Err(e) => {
                self.pending = None;
                log::warn!(
                    "check during the download of release {}: {e}; the download goes on",
                    self.version
                );
                t.polled(Some(&e));
                Ok(())
            }
        }
    }

    /// Fetch the manifest unconditionally on a helper thread.
    fn start(&mut self, t: &mut dyn Ticker) {
        let Some(f) = self.poller.fetcher.cloned() else {
            return;
        };
        let origin = self.origin.clone();
        let preferred = *self.poller.preferred;
        log::debug!(
            "checking {} during the download of release {}",
            origin.to_arg(),
            self.version
        );
        match Background::spawn(move || {
            let mut s = Source::new(origin, Some(f), preferred);
            let answer = s.manifest(None);
            (answer, s.preferred())
        }) {
            Ok(call) => self.pending = Some(call),
            Err(e) => {
                log::warn!("check during the download of release {}: {e}", self.version);
                t.polled(Some(&e));
            }
        }
    }

    /// Verify a fetched manifest exactly as a poll does, and act on it.
    fn evaluate(
        &mut self,
        answer: Result<Fetched>,
        preferred: usize,
        t: &mut dyn Ticker,
    ) -> Result<()> {
        *self.last_check = Some(Timestamp::now());
        crate::poll::set_preferred(self.poller.store, self.poller.preferred, preferred)?;
        let r = self
            .poller
            .verified_from(&self.origin, true, Some(answer), t);
        if let Err(e) = &r {
            if e.kind() == Kind::Stopped {
                return r.map(|_| ());
            }
        }
        check::note_check(
            self.poller.store,
            r.as_ref().map(|_| ()),
            self.reports,
            self.last_error,
        )?;
        t.polled(r.as_ref().err());
        let r = match r {
            Ok(Polled::Stale(why)) => {
                log::info!(
                    "check during the download of release {}: {why}; the download goes on",
                    self.version
                );
                return Ok(());
            }
            Ok(Polled::Verified(v)) => Ok(*v),
            Err(e) => Err(e),
        };
        match r {
            Ok(v) if v.manifest.image == self.image => {
                log::info!(
                    "check during the download of release {}: manifest serial {} names the image being downloaded; nothing changes",
                    self.version,
                    v.manifest.serial
                );
                Ok(())
            }
            Ok(v) => {
                log::info!(
                    "check during the download of release {}: manifest serial {} names release {} with another image",
                    self.version,
                    v.manifest.serial,
                    v.manifest.release.version
                );
                let e = superseded(&v);
                *self.found = Some(v);
                Err(e)
            }
            Err(e) => {
                log::warn!(
                    "check during the download of release {}: {e}; the download goes on",
                    self.version
                );
                Ok(())
            }
        }
    }
}

/// What the driver's ticker sees during a download: progress for status,
/// the deadline, and the polls meanwhile.
pub(super) struct Tracker<'a> {
    pub(super) inner: &'a mut dyn Ticker,
    pub(super) progress: &'a mut Option<Progress>,
    pub(super) deadline: Option<Deadline>,
    pub(super) watch: Option<Watch<'a>>,
    /// A job from a DDI server: its cancels and progress feedback.
    pub(super) fleet: Option<super::fleet::FleetWatch<'a>>,
}

impl Ticker for Tracker<'_> {
    fn tick(&mut self, p: &Progress) -> Result<()> {
        *self.progress = Some(p.clone());
        if let Some(d) = self.deadline.as_mut() {
            d.check(p)?;
        }
        if let Some(w) = self.watch.as_mut() {
            w.tick(&mut *self.inner)?;
        }
        if let Some(f) = self.fleet.as_mut() {
            f.tick(p, &mut *self.inner)?;
        }
        self.inner.tick(p)
    }

    fn wait(&mut self, fds: &[std::os::fd::BorrowedFd<'_>], max: Duration) -> Result<()> {
        self.inner.wait(fds, max)
    }
}

impl Machine {
    /// The configured server as an origin, when `job` came from it (so its
    /// mirrors apply, and polls may supersede it).
    pub(super) fn job_origin(&self, job: &Job) -> (Origin, bool) {
        let url = &self.cfg.server.manifest_url;
        if !url.is_empty() && Origin::parse(url, &[]).to_arg() == job.source {
            (Origin::parse(url, &self.cfg.server.mirrors), true)
        } else {
            (Origin::parse(&job.source, &[]), false)
        }
    }

    /// Whether a check of `origin` may supersede the job of `state`: the
    /// slot has not been switched yet and the job came from that origin
    /// (an operator's install from elsewhere is not replaced by polls).
    pub(super) fn supersedable(&self, state: &State, origin: &Origin) -> bool {
        let early = matches!(
            state,
            State::Downloading(_) | State::Installing(_) | State::Installed(_)
        );
        early
            && state
                .job()
                .is_some_and(|j| self.job_origin(j).1 && origin.to_arg() == j.source)
    }

    /// A verified manifest names another image than the job in progress:
    /// the job ends (`failed`, history `superseded`, its install report
    /// saying by what) with its slot out of the boot order, then the
    /// manifest is acted on as any check's would be.
    pub(super) fn supersede(
        &mut self,
        origin: &Origin,
        v: Verified,
        t: &mut dyn Ticker,
    ) -> Result<CheckOutcome> {
        let state = self.state()?;
        let Some(job) = state.job().cloned() else {
            bail!(Store, "no job to supersede in state {}", state.name());
        };
        // A release the hardware floor refuses leaves the job it would
        // supersede alone.
        self.gate_install(&v.manifest)?;
        self.gate_provenance(origin, &v.manifest, t)?;
        let reason = format!(
            "superseded by release {} serial {}",
            v.manifest.release.version, v.manifest.serial
        );
        self.abandon(&state, job, &reason, "superseded", t)?;
        let now = self.state()?;
        let outcome = self.decide(origin, false, &now, v, t)?;
        if let Some(why) = outcome.why() {
            log::info!("check: {why}");
            self.enter(State::Idle, "", None, vec![])?;
        }
        Ok(outcome)
    }

    /// End a job before the switch: its delta spool removed, its slot out
    /// of the boot order (a trial may have been set just before a crash in
    /// `installed`), `failed` with `reason`.
    pub(super) fn abandon(
        &mut self,
        state: &State,
        job: Job,
        reason: &str,
        event: &str,
        t: &mut dyn Ticker,
    ) -> Result<()> {
        if let Method::Delta { url, .. } = &job.method {
            if let Ok(d) = self.job_manifest().and_then(|m| job_delta(&m, url)) {
                let _ = std::fs::remove_file(spool_path(&self.cfg.system.state_dir, &d.sha256));
            }
        }
        if matches!(state, State::Installed(_)) {
            self.boot.disable_with(job.target, t)?;
        }
        self.fail(job, reason, event)
    }

    /// Whether the job's promise still holds right before its slot is
    /// switched in: its manifest has not expired, or the manifest fetched
    /// again now is valid and names the same image (`Ok(None)`). A valid
    /// manifest naming another image is returned; anything else (expired
    /// again, unreachable, refused) is the error that keeps the switch
    /// from happening.
    pub(super) fn promise(&mut self, job: &Job, t: &mut dyn Ticker) -> Result<Option<Verified>> {
        let m = self.job_manifest()?;
        if Timestamp::now() < m.expires {
            return Ok(None);
        }
        log::info!(
            "release {} slot {}: its manifest serial {} expired at {}; fetching the manifest again before the switch",
            job.version,
            job.target,
            m.serial,
            m.expires
        );
        let (origin, default_origin) = self.job_origin(job);
        if origin.is_remote() && self.fetcher.is_none() {
            self.fetcher = Some(Fetcher::new(&self.cfg)?);
        }
        let mut poller = self.poller();
        let not_switching = |e: Error| {
            e.wrap(format!(
                "not switching to slot {}: the manifest of release {} (serial {}) expired at {} and fetching it again failed",
                job.target, job.version, m.serial, m.expires
            ))
        };
        let v = match poller
            .verified_manifest(&origin, default_origin, t)
            .map_err(not_switching)?
        {
            Polled::Verified(v) => *v,
            // Signed under an older key document than the device trusts:
            // no valid promise yet; the switch waits for the next attempt.
            Polled::Stale(why) => return Err(not_switching(Error::new(Kind::Network, why))),
        };
        if v.manifest.image == job.image {
            log::info!(
                "release {} slot {}: manifest serial {} names the same image and is valid until {}",
                job.version,
                job.target,
                v.manifest.serial,
                v.manifest.expires
            );
            return Ok(None);
        }
        Ok(Some(v))
    }
}
