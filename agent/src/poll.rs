//! One poll of a release source: the manifest fetched (conditionally where
//! a verified copy is cached), key documents followed, the envelope
//! verified and the policy applied, yielding a manifest this device may act
//! on.
//!
//! What a poll learns is persisted here because it is true whatever the
//! device decides next: a higher serial and clock floor, accepted key
//! documents, the verified manifest and its ETag for the next conditional
//! request, the mirror that answered. A poll that finds nothing new writes
//! nothing: an idle device polled every few minutes for years must not wear
//! its flash out on ETags.
//!
//! Why the cache is evaluated again on a `304`: the decision a manifest
//! leads to is not persisted, so a release whose check was interrupted
//! (power cut, crash) before its job was written is picked up at the next
//! poll, with no extra state. And why the ETag ages out: some servers'
//! ETags do not change with the content (nginx's is the modification second
//! and the size), so an unconditional fetch every few hours bounds how long
//! a stale one can hide a new manifest.
//!
//! This module never decides whether to install (that is the state
//! machine's [`crate::machine::Machine::check`]) and never writes a state,
//! a history line or a report.

use crate::bail;
use crate::clock;
use crate::error::{Error, Result};
use crate::fetch::{Fetched, Fetcher};
use crate::manifest::{self, Freshness, KeyEpoch, Manifest};
use crate::progress::Ticker;
use crate::report;
use crate::slot::SlotName;
use crate::source::{Origin, Source};
use crate::store::Event;
use crate::store::Store;
use crate::timestamp::Timestamp;
use crate::trust::Trust;

/// Seconds an ETag is used for conditional polls before one unconditional
/// fetch; also how often a key document no manifest named yet is looked for.
const ETAG_MAX_AGE: i64 = 6 * 3600;

/// How far the clock may be behind a manifest's signing time.
const CLOCK_SKEW: i64 = 300;

/// A manifest whose signatures, channel, key epoch, expiry, serial and
/// compatibility passed.
pub(crate) struct Verified {
    pub(crate) manifest: Manifest,
    pub(crate) freshness: Freshness,
}

/// What a poll found.
pub(crate) enum Polled {
    /// A manifest this device may act on.
    Verified(Box<Verified>),
    /// A well-signed manifest from before a key rotation the device already
    /// follows (a server or CDN edge lagging behind): nothing was stored,
    /// nothing failed, the next poll looks again. Says why.
    Stale(String),
}

/// What one poll reads and updates.
pub(crate) struct Poller<'a> {
    pub(crate) store: &'a Store,
    pub(crate) trust: &'a mut Trust,
    pub(crate) fetcher: Option<&'a Fetcher>,
    /// Index of the base URL (server or mirror) that answered last.
    pub(crate) preferred: &'a mut usize,
    /// This device's hardware id.
    pub(crate) compatible: &'a str,
    /// The channel this device follows.
    pub(crate) channel: &'a str,
    /// A manifest of an earlier key epoch signed longer ago than this is
    /// no lagging edge but a server that missed the rotation: reported.
    pub(crate) stale_limit: std::time::Duration,
}

impl Poller<'_> {
    /// Fetch, verify and check the manifest at `origin`. `default_origin`:
    /// the configured server, whose manifest and ETag are cached.
    pub(crate) fn verified_manifest(
        &mut self,
        origin: &Origin,
        default_origin: bool,
        t: &mut dyn Ticker,
    ) -> Result<Polled> {
        self.verified_from(origin, default_origin, None, t)
    }

    /// [`Poller::verified_manifest`] with the answer to its first request
    /// already in hand (`prefetched`: an unconditional GET made on a helper
    /// thread while a download went on); `None` fetches it here.
    pub(crate) fn verified_from(
        &mut self,
        origin: &Origin,
        default_origin: bool,
        prefetched: Option<Result<Fetched>>,
        t: &mut dyn Ticker,
    ) -> Result<Polled> {
        let now = Timestamp::now();
        clock::check(now, self.store.time_floor()?)?;
        // Read once: the end of the poll compares against these.
        let stored_etag = if default_origin {
            self.store.get("etag")?.filter(|e| !e.is_empty())
        } else {
            None
        };
        // A 304 only saves the transfer: the cached manifest is evaluated
        // again exactly as a fresh one would be, so an answer that was
        // interrupted (power cut, crash) before it was acted on is acted on
        // now.
        let mut cached = if default_origin {
            self.store.get("manifest_cache")?
        } else {
            None
        };
        // Not every server's ETag changes with the content (nginx's is the
        // modification second and the size): fetch unconditionally now and
        // then so a stale ETag cannot hide a new manifest for long.
        let fresh = self
            .store
            .get("etag_time")?
            .and_then(|t| t.parse::<i64>().ok())
            .is_some_and(|t| now.0 - t < ETAG_MAX_AGE);
        let etag = stored_etag.as_deref().filter(|_| cached.is_some() && fresh);
        let first = match prefetched {
            Some(answer) => answer?,
            None => self.fetch_manifest(origin, etag, t)?,
        };
        let (raw, new_etag, fetched_body) = match first {
            Fetched::Body { bytes, etag } => (bytes, etag, true),
            // The cached manifest is what was fetched: nothing to compare.
            Fetched::NotModified => match cached.take() {
                Some(c) => (c.into_bytes(), etag.map(str::to_string), false),
                None => match self.fetch_manifest(origin, None, t)? {
                    Fetched::Body { bytes, etag } => (bytes, etag, true),
                    Fetched::NotModified => bail!(
                        Network,
                        "the server answered 304 to an unconditional request"
                    ),
                },
            },
        };
        // Look for a key document no manifest named yet every few hours, so
        // a revocation reaches devices even if manifests do not name it.
        let probe_keys = default_origin
            && self
                .store
                .get("keys_probe_time")?
                .and_then(|t| t.parse::<i64>().ok())
                .is_none_or(|t| now.0 - t >= ETAG_MAX_AGE);
        self.update_keys(origin, &raw, probe_keys, t)?;
        if probe_keys {
            self.store.set("keys_probe_time", &now.0.to_string())?;
        }
        let vm = manifest::verify(&raw, self.trust)?;
        let m = vm.manifest;
        // Before anything is stored: floors are per channel and per key
        // document, so a manifest of another channel or epoch must not move
        // one.
        m.check_channel(self.channel)?;
        // Expiry before staleness: a frozen mirror replaying month-old
        // manifests of the previous key epoch is refused (and reported),
        // not waited out as a lagging edge.
        m.check_expiry(now)?;
        let epoch = self.trust.version();
        let trusted = (!self.trust.is_simple()).then_some(epoch);
        if let KeyEpoch::Stale { manifest, trusted } = m.check_keys_version(trusted)? {
            let age = now.0.saturating_sub(m.issued.0).max(0) as u64;
            if age > self.stale_limit.as_secs() {
                bail!(
                    Policy,
                    "manifest serial {} (release {}) is signed under key document v{manifest}, older than the v{trusted} this device trusts, and was signed {} ago (server.stale_limit {}): the server has not caught up with the key rotation",
                    m.serial,
                    m.release.version,
                    crate::timestamp::format_duration(std::time::Duration::from_secs(age)),
                    crate::timestamp::format_duration(self.stale_limit)
                );
            }
            return Ok(Polled::Stale(format!(
                "manifest serial {} (release {}) is signed under key document v{manifest}, older than \
                 the v{trusted} this device trusts: the server has not caught up with the key rotation; \
                 polling again later",
                m.serial, m.release.version
            )));
        }
        if now.0 + CLOCK_SKEW < m.issued.0 {
            bail!(
                Clock,
                "manifest serial {} was signed at {}, after the system clock ({now}): waiting for time synchronisation",
                m.serial,
                m.issued
            );
        }
        let floor = self.store.floor(self.channel, epoch)?;
        let freshness = m.check_policy(now, floor, self.compatible)?;
        // An encrypted release this device cannot read is refused here,
        // before anything is stored or downloaded.
        crate::encrypt::frame_key(&m)?;
        if freshness == Freshness::Unchanged {
            let named = self.store.serial_image(self.channel, epoch, m.serial)?;
            if let Some(warning) = m.serial_reuse(named.as_ref()) {
                log::warn!("{warning}");
            }
        }
        self.store
            .accept_manifest(self.channel, epoch, m.serial, m.issued, &m.image.sha256)?;
        if default_origin {
            // Cache what was verified, for the next 304.
            match std::str::from_utf8(&raw) {
                Ok(text) => {
                    if fetched_body && cached.as_deref() != Some(text) {
                        self.store.set("manifest_cache", text)?;
                    }
                    // Written only when something changed: an idle poll
                    // against a server without ETags writes nothing either.
                    let new = new_etag.as_deref().unwrap_or("");
                    if fetched_body && !new.is_empty() {
                        if stored_etag.as_deref() != Some(new) || !fresh {
                            self.store.set("etag", new)?;
                            self.store.set("etag_time", &now.0.to_string())?;
                        }
                    } else if fetched_body && stored_etag.is_some() {
                        self.store.set("etag", "")?;
                    }
                }
                Err(_) => self.store.set("etag", "")?,
            }
        }
        Ok(Polled::Verified(Box::new(Verified {
            manifest: m,
            freshness,
        })))
    }

    /// Fetch the manifest (on a helper thread for remote origins).
    fn fetch_manifest(
        &mut self,
        origin: &Origin,
        etag: Option<&str>,
        t: &mut dyn Ticker,
    ) -> Result<Fetched> {
        match self.fetcher.cloned() {
            Some(f) if origin.is_remote() => {
                let o = origin.clone();
                let pref = *self.preferred;
                let etag = etag.map(str::to_string);
                let (res, pref) = crate::worker::offload(
                    "check",
                    move || {
                        let mut s = Source::new(o, Some(f), pref);
                        let r = s.manifest(etag.as_deref());
                        (r, s.preferred())
                    },
                    t,
                )?;
                self.set_preferred(pref)?;
                res
            }
            _ => Source::new(origin.clone(), None, 0).manifest(None),
        }
    }

    fn set_preferred(&mut self, pref: usize) -> Result<()> {
        set_preferred(self.store, self.preferred, pref)
    }

    /// Fetch and accept newer key documents the manifest calls for. With
    /// `probe`, also look for the next version when none is named, so a
    /// revocation reaches devices even if manifests do not name it (the
    /// caller does this every few hours, not on every poll).
    fn update_keys(
        &mut self,
        origin: &Origin,
        raw: &[u8],
        probe: bool,
        t: &mut dyn Ticker,
    ) -> Result<()> {
        let hint = manifest::keys_version_hint(raw);
        for _ in 0..64 {
            let Some(version) = self.trust.needs(hint) else {
                if probe && !self.trust.is_simple() {
                    self.probe_next_keys(origin, t);
                }
                return Ok(());
            };
            let doc = self.fetch_key_document(origin, version, t)?;
            self.accept_key_document(version, &doc)?;
        }
        bail!(Signature, "more than 64 key documents in one check")
    }

    fn fetch_key_document(
        &mut self,
        origin: &Origin,
        version: u64,
        t: &mut dyn Ticker,
    ) -> Result<Vec<u8>> {
        match self.fetcher.cloned() {
            Some(f) if origin.is_remote() => {
                let o = origin.clone();
                let pref = *self.preferred;
                crate::worker::offload(
                    "keys",
                    move || Source::new(o, Some(f), pref).key_document(version),
                    t,
                )?
            }
            _ => Source::new(origin.clone(), None, 0).key_document(version),
        }
    }

    fn accept_key_document(&mut self, version: u64, doc: &[u8]) -> Result<()> {
        let what = format!("key document keys/{version}.json");
        let accepted = self.trust.accept(doc, &what)?;
        let (v, release) = (accepted.version, accepted.release.len());
        self.store.put_key_document(v, doc)?;
        log::info!("accepted {what}: version {v}, {release} release key(s)");
        Ok(())
    }

    /// Look for key document N+1 that no manifest named yet. Absent is the
    /// normal case; anything wrong with it is logged, never fatal here.
    fn probe_next_keys(&mut self, origin: &Origin, t: &mut dyn Ticker) {
        let next = self.trust.version() + 1;
        match self.fetch_key_document(origin, next, t) {
            Ok(doc) => {
                if let Err(e) = self.accept_key_document(next, &doc) {
                    log::warn!("ignoring keys/{next}.json found beside the manifest: {e}");
                }
            }
            Err(e) => log::debug!("no keys/{next}.json yet: {e}"),
        }
    }
}

/// Remember which base URL answered, when it changed.
pub(crate) fn set_preferred(store: &Store, preferred: &mut usize, pref: usize) -> Result<()> {
    if pref != *preferred {
        *preferred = pref;
        store.set("preferred_mirror", &pref.to_string())?;
    }
    Ok(())
}

/// Record a failed check: a history line and a `check` report (with
/// `reports`: this device's id and booted slot), in one transaction. A
/// failure with the same reason as the last one only folds into the outbox,
/// so a server that is down for a week writes one history line, not a
/// thousand.
pub(crate) fn record_failure(
    store: &Store,
    e: &Error,
    reports: Option<(&str, SlotName)>,
) -> Result<()> {
    let report = reports
        .map(|(id, booted)| report::check_failed(id, booted, e.kind().as_str(), e.message()));
    let previous = store.get("last_check_error")?;
    if previous.as_deref() == Some(e.message()) {
        return match report {
            Some(r) => store.push_report(&r.as_report()),
            None => Ok(()),
        };
    }
    let ev = Event {
        event: "check-failed",
        detail: Some(e.message()),
        ..Event::default()
    };
    store.atomically(|s| {
        s.add_history(&ev)?;
        if let Some(r) = &report {
            s.push_report(&r.as_report())?;
        }
        s.set("last_check_error", e.message())
    })
}
