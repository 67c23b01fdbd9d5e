//! The provenance gate: a device configured with builder keys
//! (`[provenance]`) installs a release only when its build provenance
//! attestation is there, is signed by its builders and names every
//! artifact the release installs ([`crate::manifest::provenance`]).
//!
//! Why here, beside the hardware floor's gate: it runs where an install
//! starts (a new job, a supersede, components of the running slot), after
//! the device decided it wants the release and before anything about the
//! install is written, so a refusal leaves the active slot, the job and
//! the serial floor as they were and is reported like any failed check.
//! It fetches only the attestation file (size-bounded by the signed
//! manifest, hash-checked); it never fetches one when no builder is
//! configured, and never relaxes a requirement because the file cannot be
//! fetched.

use std::io::Read;

use super::*;
use crate::manifest::provenance::{self, AttestationRef};

impl Machine {
    /// Refuse `m` unless its attestation satisfies the configured builders;
    /// nothing to do when none are configured.
    pub(super) fn gate_provenance(
        &mut self,
        origin: &Origin,
        m: &Manifest,
        t: &mut dyn Ticker,
    ) -> Result<()> {
        let Some(builders) = self.builders.clone() else {
            return Ok(());
        };
        let release = format!(
            "release {} (manifest serial {})",
            m.release.version, m.serial
        );
        let Some(at) = &m.attestation else {
            bail!(
                Policy,
                "{release}: attestation missing: this device requires a build provenance \
                 attestation signed by its builders ([provenance] builders)"
            );
        };
        let raw = self
            .fetch_attestation(origin, at, t)
            .map_err(|e| e.wrap(format!("{release}: attestation {}", at.url)))?;
        let statement = provenance::verify(&raw, &builders).map_err(|e| e.wrap(&release))?;
        provenance::attested(m, &statement)
            .map_err(|missing| err!(Policy, "{release}: {missing}"))?;
        log::info!(
            "{release}: attestation {} by builder {} names its {} artifact(s) and image",
            at.url,
            statement.builder_id.as_deref().unwrap_or("(no builder id)"),
            provenance::required(m).len() - 1
        );
        Ok(())
    }

    /// The attestation's bytes, exactly its signed size and hash.
    fn fetch_attestation(
        &mut self,
        origin: &Origin,
        at: &AttestationRef,
        t: &mut dyn Ticker,
    ) -> Result<Vec<u8>> {
        let (url, size) = (at.url.clone(), at.size);
        let read = move |mut s: Source| -> Result<Vec<u8>> {
            let mut bytes = Vec::with_capacity(size as usize);
            s.open(&url, 0, size)?
                .take(size)
                .read_to_end(&mut bytes)
                .map_err(|e| err!(Network, "reading {url}: {e}"))?;
            Ok(bytes)
        };
        let bytes = match self.fetcher.clone() {
            Some(f) if origin.is_remote() => {
                let (o, pref) = (origin.clone(), self.preferred);
                crate::worker::offload(
                    "attestation",
                    move || read(Source::new(o, Some(f), pref)),
                    t,
                )??
            }
            _ => read(Source::new(origin.clone(), None, 0))?,
        };
        if bytes.len() as u64 != size || Sha256::of(&bytes) != at.sha256 {
            bail!(
                Integrity,
                "{} bytes with sha256 {}, the manifest signs {size} bytes with sha256 {}",
                bytes.len(),
                Sha256::of(&bytes).short(),
                at.sha256.short()
            );
        }
        Ok(bytes)
    }
}
