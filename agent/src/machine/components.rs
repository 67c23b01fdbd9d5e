//! The components of a release besides its slot, when the slot runs
//! already: an application-only release, installed without a reboot
//! ([docs/components.md](../../../docs/components.md)).
//!
//! What a verified release means for each component is [`plan`], a pure
//! function of values (what the release lists, what the device is
//! configured for, what it runs, what it rolled back before), tested row
//! by row below. Carrying a plan out is [`Machine::install_components`]:
//! every changed app's new generation written and checked first, then all
//! of them activated, their units restarted and their health checks run,
//! then all committed or all rolled back. A release is installed as one:
//! one failed app rolls every app of the release back.
//!
//! Persistence: what runs is `component.<name>` in the store, the release
//! in progress `components_job` ([`crate::store::component`]); both are
//! keys the previous release of updraft never reads. A power cut before the commit leaves
//! `components_job`, and the next start ([`Machine::recover_components`])
//! puts every app back on the generation it ran before: the release is
//! tried again from the next poll, its unchanged files linked, not
//! downloaded.
//!
//! A `boot` component is the slot's boot files ([`crate::app::boot`]): it
//! is written, tried and rolled back with a slot, never alone. A release
//! that changes them while its slot runs already installs that slot again
//! (`Plan::WithSlot`), so the files are tried in a counted trial boot like
//! any slot.
//!
//! This module never touches the bootloader, and writes no slot.

use super::*;
use crate::app::blobs::{SourceBlobs, fetch_index};
use crate::app::generation::App;
use crate::app::index::{Index, Limits};
use crate::app::pack::PackBlobs;
use crate::artifact::VerifiedFrames;
use crate::config::ComponentConfig;
use crate::handler::{Handler, Phase, Run};
use crate::health::{HealthRun, Verdict as HealthVerdict};
use crate::manifest::component::{Component, Kind as CKind, Part, TreePart};

use crate::state::{ComponentsJob, Record, Step};
use crate::store::Running;
use crate::store::component::JOB as JOB_KEY;

/// What the device knows of one component the release lists.
#[derive(Debug, Clone, Copy)]
pub(super) struct Known<'a> {
    pub(super) configured: Option<&'a ComponentConfig>,
    /// Version and content running.
    pub(super) running: Option<(&'a str, Sha256)>,
    /// Content rolled back here before.
    pub(super) rejected: Option<Sha256>,
}

/// What a release means for its components besides the slot.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Plan<'a> {
    /// Every component runs already.
    Unchanged,
    /// Rolled back here before (and the operator did not ask): why.
    Declined(String),
    /// These components change; the others run already.
    Install(Vec<&'a Component>),
    /// These change, the slot's boot files among them: boot files are
    /// tried in a trial boot, so the slot running already is installed
    /// again with them.
    WithSlot(Vec<&'a Component>),
}

/// The rules, in order: every component must be configured on this device
/// with its kind (a release never decides where bytes go or what runs);
/// a component whose content runs is unchanged; one rolled back here before declines
/// the release unless the operator asks; changed boot files need a boot.
pub(super) fn plan<'a>(
    components: &'a [Component],
    known: &[Known<'_>],
    operator: bool,
) -> std::result::Result<Plan<'a>, String> {
    let mut install = Vec::new();
    for (c, k) in components.iter().zip(known) {
        let Some(cfg) = k.configured else {
            return Err(format!(
                "component {} ({}) is not configured on this device: add [components.{}] to its configuration",
                c.name,
                c.kind().as_str(),
                c.name
            ));
        };
        if cfg.kind != c.kind() {
            return Err(format!(
                "component {} is of kind {} in the release but configured as {}",
                c.name,
                c.kind().as_str(),
                cfg.kind.as_str()
            ));
        }
        if k.running.is_some_and(|(_, content)| content == c.content()) {
            continue;
        }
        if !operator && k.rejected == Some(c.content()) {
            return Ok(Plan::Declined(format!(
                "component {} {} was rolled back on this device before; \
                 `updraft install` installs it again",
                c.name, c.version
            )));
        }
        install.push(c);
    }
    Ok(if install.is_empty() {
        Plan::Unchanged
    } else if install.iter().any(|c| c.kind() == CKind::Boot) {
        Plan::WithSlot(install)
    } else {
        Plan::Install(install)
    })
}

/// What a slot's job writes besides the slot, from the plan of the
/// release's components: the changed ones, and the boot files whatever
/// runs. Boot files belong to the slot they are written with: the slot
/// being installed has another release's in its directory (or none), so
/// boot files that did not change since the running release are still
/// written there (copied from the booted slot's, not downloaded).
pub(super) fn with_the_slot<'a>(components: &'a [Component], plan: Plan<'a>) -> Vec<&'a Component> {
    let mut written = match plan {
        Plan::Install(changed) | Plan::WithSlot(changed) => changed,
        Plan::Unchanged | Plan::Declined(_) => Vec::new(),
    };
    for c in components.iter().filter(|c| c.kind() == CKind::Boot) {
        if !written.iter().any(|w| w.name == c.name) {
            written.insert(0, c);
        }
    }
    written
}

/// The record of component `c` about to be installed.
fn new_record(c: &Component) -> Record {
    Record {
        name: c.name.clone(),
        kind: c.kind().as_str().into(),
        version: c.version.clone(),
        content: c.content(),
        step: Step::Writing,
        generation: None,
        previous: None,
        bytes: 0,
    }
}

impl Machine {
    /// What release `m` means for its components besides the slot, from
    /// the store and the configuration.
    fn component_plan<'m>(&self, m: &'m Manifest, operator: bool) -> Result<Plan<'m>> {
        let mut running = Vec::with_capacity(m.components.len());
        let mut rejected = Vec::with_capacity(m.components.len());
        for c in &m.components {
            running.push(self.store.running_component(&c.name)?);
            rejected.push(self.store.rejected_component(&c.name)?);
        }
        let known: Vec<Known<'_>> = m
            .components
            .iter()
            .enumerate()
            .map(|(i, c)| Known {
                configured: self.cfg.component(&c.name),
                running: running[i].as_ref().map(|r| (r.version.as_str(), r.content)),
                rejected: rejected[i],
            })
            .collect();
        plan(&m.components, &known, operator)
            .map_err(|why| err!(Policy, "release {}: {why}", m.release.version))
    }

    /// The records of the components that change with the slot of `m`
    /// (the slot's job carries them): checked before anything is written.
    /// A component rolled back before comes again with a new slot.
    pub(super) fn slot_job_components(&self, m: &Manifest) -> Result<Vec<Record>> {
        let plan = self.component_plan(m, true)?;
        Ok(with_the_slot(&m.components, plan)
            .into_iter()
            .map(new_record)
            .collect())
    }

    /// The slot of `m` runs already (`why` says so): install the
    /// release's changed components, if any.
    pub(super) fn running_slot(
        &mut self,
        origin: &Origin,
        operator: bool,
        m: &Manifest,
        why: String,
        t: &mut dyn Ticker,
    ) -> Result<CheckOutcome> {
        if m.components.is_empty() {
            return Ok(CheckOutcome::Running(why));
        }
        match self.component_plan(m, operator) {
            Err(e) => Err(e),
            Ok(Plan::Unchanged) => Ok(CheckOutcome::Running(format!(
                "{why}; its {} other component(s) run already",
                m.components.len()
            ))),
            Ok(Plan::Declined(why)) => Ok(CheckOutcome::Declined(why)),
            Ok(Plan::WithSlot(changed)) => {
                let names: Vec<String> = changed
                    .iter()
                    .map(|c| format!("{} {}", c.name, c.version))
                    .collect();
                log::info!(
                    "release {}: its slot runs already in slot {}, but its boot files change ({}): \
                     slot {} is installed again with them and tried in a trial boot",
                    m.release.version,
                    self.booted,
                    names.join(", "),
                    self.booted.other()
                );
                self.gate_install(m)?;
                self.gate_provenance(origin, m, t)?;
                if !operator {
                    if let Some(why) = self.write_held(&m.release.version) {
                        return Ok(CheckOutcome::Held(why));
                    }
                }
                self.plan(origin, m, t)
            }
            Ok(Plan::Install(changed)) => {
                self.gate_install(m)?;
                self.gate_provenance(origin, m, t)?;
                let changed: Vec<Component> = changed.into_iter().cloned().collect();
                self.install_components(origin, m, &changed, t)
            }
        }
    }

    fn save_components_job(&self, job: Option<&ComponentsJob>) -> Result<()> {
        let text = match job {
            Some(j) => {
                serde_json::to_string(j).map_err(|e| err!(Io, "serialising {JOB_KEY}: {e}"))?
            }
            None => String::new(),
        };
        self.store.set(JOB_KEY, &text)
    }

    fn components_job(&self) -> Result<Option<ComponentsJob>> {
        match self.store.get(JOB_KEY)? {
            Some(text) if !text.is_empty() => serde_json::from_str(&text)
                .map(Some)
                .map_err(|e| err!(Store, "stored {JOB_KEY}: {e}")),
            _ => Ok(None),
        }
    }

    fn app(&self, name: &str) -> App {
        App::new(&self.cfg.apps.dir, name)
    }

    /// Install `changed` (apps) of release `m` without a reboot: write
    /// every new generation, activate them all, restart their units, run
    /// their health checks, then commit all or roll all back.
    pub(super) fn install_components(
        &mut self,
        origin: &Origin,
        m: &Manifest,
        changed: &[Component],
        t: &mut dyn Ticker,
    ) -> Result<CheckOutcome> {
        let started = std::time::Instant::now();
        let release = m.release.version.clone();
        let mut job = ComponentsJob {
            release: release.clone(),
            serial: m.serial,
            started: Timestamp::now(),
            components: changed.iter().map(new_record).collect(),
        };
        self.save_components_job(Some(&job))?;
        let names: Vec<String> = changed
            .iter()
            .map(|c| format!("{} {}", c.name, c.version))
            .collect();
        log::info!(
            "release {release}: installing component(s) {} without a reboot (slot {} runs already)",
            names.join(", "),
            self.booted
        );
        if let Err(e) = self.write_components(origin, changed, &mut job, t) {
            self.undo_components(&job, t);
            self.components_ended("failed", "failed", &job, &format!("{e}"))?;
            return Err(e.wrap(format!("release {release}")));
        }
        // All written: switch them together.
        let mut records = std::mem::take(&mut job.components);
        let (serial, since) = (job.serial, job.started);
        let activated = self.activate_records(&release, &mut records, t, |m, r| {
            m.save_components_job(Some(&ComponentsJob {
                release: release.clone(),
                serial,
                started: since,
                components: r.to_vec(),
            }))
        })?;
        job.components = records;
        if let Err(why) = activated {
            return self.roll_back_components(job, &why, t);
        }
        if let Err(why) = self.records_healthy(&release, &job.components, t)? {
            return self.roll_back_components(job, &why, t);
        }
        let outcome = self.commit_components(&job, started.elapsed())?;
        self.committed_floor(&release, m.security_version)?;
        Ok(outcome)
    }

    /// Activate every written record's generation and restart its units;
    /// `save` persists the records after each switch, before its units
    /// restart. `Err(why)` when a switch or a restart failed (the records
    /// say how far it got).
    pub(super) fn activate_records(
        &mut self,
        release: &str,
        records: &mut [Record],
        t: &mut dyn Ticker,
        save: impl Fn(&Machine, &[Record]) -> Result<()>,
    ) -> Result<std::result::Result<(), String>> {
        for i in 0..records.len() {
            if records[i].step != Step::Written {
                continue;
            }
            let name = records[i].name.clone();
            if records[i].kind == CKind::Boot.as_str() {
                // The slot's switch activated them: this is its trial boot.
                records[i].step = Step::Active;
                save(self, records)?;
                log::info!(
                    "release {release} component {name}: boot files of slot {} in use",
                    self.booted
                );
                continue;
            }
            if records[i].kind == CKind::Command.as_str() {
                // Marked active first: a rollback must reach the handler
                // even when `activate` fails half way.
                records[i].step = Step::Active;
                save(self, records)?;
                if let Err(e) = self.run_phase(release, &records[i], Phase::Activate, None, t) {
                    return Ok(Err(e.to_string()));
                }
                log::info!("release {release} component {name}: activated by its handler");
                continue;
            }
            let Some(n) = records[i].generation else {
                continue;
            };
            match self.app(&name).activate(n) {
                Ok(previous) => {
                    records[i].previous = previous;
                    records[i].step = Step::Active;
                    save(self, records)?;
                }
                Err(e) => return Ok(Err(format!("component {name}: {e}"))),
            }
            if let Err(e) = self.restart_units(&name, t) {
                return Ok(Err(e.to_string()));
            }
            log::info!(
                "release {release} component {name}: generation {n} active{}",
                records[i]
                    .previous
                    .map(|p| format!(" (generation {p} before)"))
                    .unwrap_or_default()
            );
        }
        Ok(Ok(()))
    }

    /// Write each app's new generation from its signed index, reusing the
    /// running generation's unchanged files.
    fn write_components(
        &mut self,
        origin: &Origin,
        changed: &[Component],
        job: &mut ComponentsJob,
        t: &mut dyn Ticker,
    ) -> Result<()> {
        let mut records = std::mem::take(&mut job.components);
        let (release, serial, started) = (job.release.clone(), job.serial, job.started);
        let written = self.write_records(origin, changed, &release, &mut records, t, |m, r| {
            m.save_components_job(Some(&ComponentsJob {
                release: release.clone(),
                serial,
                started,
                components: r.to_vec(),
            }))
        });
        job.components = records;
        written
    }

    /// Write the new generation of every record still [`Step::Writing`]
    /// from its component in `components`; `save` persists the records
    /// after each. A record written before (a restart in between) is kept.
    pub(super) fn write_records(
        &mut self,
        origin: &Origin,
        components: &[Component],
        release: &str,
        records: &mut [Record],
        t: &mut dyn Ticker,
        save: impl Fn(&Machine, &[Record]) -> Result<()>,
    ) -> Result<()> {
        if origin.is_remote() && self.fetcher.is_none() {
            self.fetcher = Some(Fetcher::new(&self.cfg)?);
        }
        let mut src = Source::new(origin.clone(), self.fetcher.clone(), self.preferred);
        for i in 0..records.len() {
            if records[i].step != Step::Writing {
                continue;
            }
            let name = records[i].name.clone();
            let what = format!("component {name}");
            let Some(c) = components.iter().find(|c| c.name == name) else {
                bail!(Integrity, "{what} is not in the release's manifest");
            };
            let tp = match &c.part {
                Part::App(tp) | Part::Boot(tp) => tp,
                Part::Command(p) => {
                    let raw = src.open(&p.artifact.url, 0, p.artifact.size)?;
                    let payload = VerifiedFrames::new(raw, &p.artifact, &what)?;
                    self.run_phase(
                        release,
                        &records[i],
                        Phase::Install,
                        Some(Box::new(payload)),
                        t,
                    )?;
                    let rec = &mut records[i];
                    rec.step = Step::Written;
                    rec.bytes = p.artifact.size;
                    log::info!(
                        "release {release} component {name}: installed by its handler ({} bytes downloaded)",
                        rec.bytes
                    );
                    save(self, records)?;
                    continue;
                }
            };
            t.tick(&Progress {
                phase: what.clone(),
                ..Progress::default()
            })?;
            let bytes = fetch_index(&mut src, &tp.index, &what)?;
            let index = Index::parse(
                &bytes,
                Limits {
                    entries: tp.tree.entries,
                    bytes: tp.tree.bytes,
                },
            )
            .map_err(|e| e.wrap(what.clone()))?;
            let packed = origin.reads_pack(&crate::app::pack::name(&tp.index));
            let (generation, w, read) = if let Part::Boot(_) = c.part {
                let (target, booted) = self.boot_dirs(&name)?;
                with_blobs(&mut src, packed, tp, &index, |blobs| {
                    crate::app::boot::install(&target, &booted, &index, blobs)
                })
                .map(|(w, read)| (None, w, read))
            } else {
                let app = self.app(&name);
                with_blobs(&mut src, packed, tp, &index, |blobs| {
                    app.install(&index, blobs)
                })
                .map(|((n, w), read)| (Some(n), w, read))
            }
            .map_err(|e| e.wrap(what.clone()))?;
            let rec = &mut records[i];
            rec.generation = generation;
            rec.step = Step::Written;
            rec.bytes = tp.index.size + read;
            let into = match generation {
                Some(n) => format!("generation {n}"),
                None => format!("slot {}'s boot files", self.booted.other()),
            };
            log::info!(
                "release {release} component {name}: {into} written and checked: {} file(s) fetched \
                 ({} bytes; {} bytes downloaded, the index included), {} {} unchanged ({} bytes)",
                w.fetched,
                w.fetched_bytes,
                rec.bytes,
                w.reused,
                if generation.is_some() {
                    "linked"
                } else {
                    "copied"
                },
                w.reused_bytes
            );
            save(self, records)?;
        }
        Ok(())
    }

    /// Boot component `name`'s directories: the slot being installed's
    /// (the one not booted) and the booted slot's.
    fn boot_dirs(&self, name: &str) -> Result<(std::path::PathBuf, std::path::PathBuf)> {
        let cfg = self.cfg.component(name);
        match (
            cfg.and_then(|c| c.slot_dir(self.booted.other())),
            cfg.and_then(|c| c.slot_dir(self.booted)),
        ) {
            (Some(target), Some(booted)) => Ok((target.to_path_buf(), booted.to_path_buf())),
            _ => bail!(
                Config,
                "component {name}: [components.{name}] names no boot directories (a, b)"
            ),
        }
    }

    /// Run `phase` of the handler configured for command component
    /// `r`, in `<state_dir>/components/<name>`, with the version it
    /// replaces.
    fn run_phase(
        &self,
        release: &str,
        r: &Record,
        phase: Phase,
        payload: Option<Box<dyn std::io::Read + Send>>,
        t: &mut dyn Ticker,
    ) -> Result<()> {
        let Some(cfg) = self.cfg.component(&r.name) else {
            bail!(Config, "component {} is not configured", r.name);
        };
        let handler = Handler {
            component: r.name.clone(),
            argv: cfg.handler.clone(),
            timeout: cfg.timeout.0,
            work_dir: self.cfg.system.state_dir.join("components").join(&r.name),
        };
        let previous = self.store.running_component(&r.name)?.map(|p| p.version);
        let run = Run {
            phase,
            version: &r.version,
            previous_version: previous.as_deref(),
        };
        handler
            .run(&run, payload, t)
            .map(|_| ())
            .map_err(|e| e.wrap(format!("release {release}")))
    }

    /// Restart the units configured for app `name`, in one command.
    fn restart_units(&self, name: &str, t: &mut dyn Ticker) -> Result<()> {
        let Some(cfg) = self.cfg.component(name) else {
            return Ok(());
        };
        if cfg.units.is_empty() {
            return Ok(());
        }
        let mut cmd = self.cfg.apps.restart_command.clone();
        cmd.extend(cfg.units.iter().cloned());
        actions::run_bounded(
            "apps.restart_command",
            &cmd,
            self.cfg.apps.restart_timeout.0,
            "restart",
            t,
        )
        .map_err(|e| {
            e.wrap(format!(
                "component {name}: restarting {}",
                cfg.units.join(", ")
            ))
        })
    }

    /// Every activated app's health checks (its `health_dir`, its units
    /// active), one app after the other: `Err(why)` for the first failure.
    pub(super) fn records_healthy(
        &mut self,
        release: &str,
        records: &[Record],
        t: &mut dyn Ticker,
    ) -> Result<std::result::Result<(), String>> {
        for r in records.iter().filter(|r| r.step == Step::Active) {
            let Some(cfg) = self.cfg.component(&r.name).cloned() else {
                continue;
            };
            if cfg.health_dir.is_none() && cfg.units.is_empty() {
                continue;
            }
            let health = crate::config::Health {
                checks_dir: cfg.health_dir.clone().unwrap_or_default(),
                required_units: cfg.units.clone(),
                timeout: cfg.timeout,
                check_timeout: self.cfg.health.check_timeout,
                check_server: false,
            };
            let env = vec![
                ("UPDRAFT_COMPONENT".to_string(), r.name.clone()),
                ("UPDRAFT_VERSION".to_string(), r.version.clone()),
                ("UPDRAFT_RELEASE".to_string(), release.to_string()),
                (
                    "UPDRAFT_APP_DIR".to_string(),
                    self.app(&r.name).dir().display().to_string(),
                ),
            ];
            let mut run = HealthRun::start(&health, &self.cfg.system.state_dir, env)?;
            log::info!(
                "release {} component {}: running its health checks",
                release,
                r.name
            );
            let progress = Progress {
                phase: "health".into(),
                ..Progress::default()
            };
            let verdict = loop {
                if let Some(v) = run.poll() {
                    break v;
                }
                t.tick(&progress)?;
                t.wait(run.wait_fd().as_slice(), run.until_limit().min(WAIT_SLICE))?;
            };
            if let HealthVerdict::Fail(why) = verdict {
                return Ok(Err(format!("component {}: {why}", r.name)));
            }
        }
        Ok(Ok(()))
    }

    /// Every app of the job back on the generation it ran before, the new
    /// generations removed. Best effort: each failure is logged at ERROR
    /// and the others still go back.
    fn undo_components(&mut self, job: &ComponentsJob, t: &mut dyn Ticker) {
        self.undo_records(&job.release, &job.components, t);
    }

    /// The apps of a slot's job back where they were (its rollback, its
    /// failure before the switch). Nothing when it has none.
    pub(super) fn undo_job_components(&mut self, job: &Job) {
        if !job.components.is_empty() {
            let release = job.version.clone();
            self.undo_records(&release, &job.components, &mut crate::progress::NoTick);
        }
    }

    /// [`Machine::undo_components`] for the records of any release.
    pub(super) fn undo_records(&mut self, release: &str, records: &[Record], t: &mut dyn Ticker) {
        for r in records {
            if r.kind == CKind::Boot.as_str() {
                // The files of the slot left behind; the booted slot's
                // were never touched.
                continue;
            }
            if r.kind == CKind::Command.as_str() {
                // Whatever step it reached, the handler is told to undo it.
                if let Err(e) = self.run_phase(release, r, Phase::Rollback, None, t) {
                    log::error!("release {release} component {}: {e}", r.name);
                }
                continue;
            }
            // Back to what is committed, whatever the record says: a power
            // cut between the switch and the record's save leaves `current`
            // on the new generation with the record still `written`.
            let app = self.app(&r.name);
            let committed = match self.store.running_component(&r.name) {
                Ok(c) => c.and_then(|c| c.generation),
                Err(e) => {
                    log::error!("release {release} component {}: {e}", r.name);
                    r.previous
                }
            };
            let active = app.active().unwrap_or_else(|e| {
                log::error!("release {release} component {}: {e}", r.name);
                r.generation
            });
            if active != committed {
                let back = match committed {
                    Some(p) => app.activate(p).map(|_| ()),
                    None => app.deactivate(),
                };
                if let Err(e) = back {
                    log::error!(
                        "release {release} component {}: switching back: {e}",
                        r.name
                    );
                }
                if let Err(e) = self.restart_units(&r.name, t) {
                    log::error!("release {release} component {}: {e}", r.name);
                }
            }
            // The record's generation, or, for one whose number was not
            // saved yet (a cut right after it was made whole), every
            // generation newer than the committed one.
            let newer: Vec<u64> = match r.generation {
                Some(n) => vec![n],
                None => app
                    .generations()
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|n| Some(*n) > committed)
                    .collect(),
            };
            for n in newer.into_iter().filter(|n| Some(*n) != committed) {
                if let Err(e) = app.remove(n) {
                    log::error!(
                        "release {release} component {}: removing generation {n}: {e}",
                        r.name
                    );
                }
            }
        }
    }

    fn roll_back_components(
        &mut self,
        job: ComponentsJob,
        why: &str,
        t: &mut dyn Ticker,
    ) -> Result<CheckOutcome> {
        let started = std::time::Instant::now();
        self.undo_components(&job, t);
        let back: Vec<String> = job
            .components
            .iter()
            .map(|r| match r.previous {
                _ if r.kind == CKind::Command.as_str() => format!("{} by its handler", r.name),
                Some(p) => format!("{} on generation {p}", r.name),
                None => format!("{} inactive", r.name),
            })
            .collect();
        self.store.atomically(|s| {
            for r in &job.components {
                s.reject_component(&r.name, &r.content)?;
            }
            Ok(())
        })?;
        let detail = format!(
            "{why}; rolled back in {} ms: {}",
            started.elapsed().as_millis(),
            back.join(", ")
        );
        self.components_ended("rolled-back", "rolled_back", &job, &detail)?;
        log::warn!("rolled back: release {}: {detail}", job.release);
        bail!(Health, "release {}: {detail}", job.release)
    }

    fn commit_components(&mut self, job: &ComponentsJob, took: Duration) -> Result<CheckOutcome> {
        let done = self.commit_records(&job.release, &job.components)?;
        let detail = format!(
            "component(s) {} committed in {} ms without a reboot",
            done.join(", "),
            took.as_millis()
        );
        self.components_ended("committed", "committed", job, &detail)?;
        log::info!("committed: release {}: {detail}", job.release);
        Ok(CheckOutcome::Applied(format!(
            "release {}: {detail}",
            job.release
        )))
    }

    /// Record `records` as running (and the release of components done),
    /// then keep each app's configured number of generations; what was
    /// committed, one phrase per component.
    pub(super) fn commit_records(
        &mut self,
        release: &str,
        records: &[Record],
    ) -> Result<Vec<String>> {
        let now = Timestamp::now();
        self.store.atomically(|s| {
            for r in records {
                s.set_running_component(&Running {
                    name: r.name.clone(),
                    kind: r.kind.clone(),
                    version: r.version.clone(),
                    content: r.content,
                    generation: r.generation,
                    release: release.to_string(),
                    installed: now,
                })?;
            }
            s.set(JOB_KEY, "")
        })?;
        let mut done = Vec::new();
        for r in records {
            if r.kind == CKind::Boot.as_str() {
                done.push(format!(
                    "{} {} (slot {}'s boot files, {} bytes downloaded)",
                    r.name, r.version, self.booted, r.bytes
                ));
                continue;
            }
            if r.kind == CKind::Command.as_str() {
                // Recorded as running already: a failed commit phase cannot
                // undo what its activate did, so it is reported, not undone.
                if let Err(e) = self.run_phase(
                    release,
                    r,
                    Phase::Commit,
                    None,
                    &mut crate::progress::NoTick,
                ) {
                    log::error!("release {release} component {}: {e}", r.name);
                }
                done.push(format!(
                    "{} {} ({} bytes downloaded)",
                    r.name, r.version, r.bytes
                ));
                continue;
            }
            let keep = self.cfg.component(&r.name).map(|c| c.keep).unwrap_or(2);
            match self.app(&r.name).prune(keep) {
                Ok(removed) if !removed.is_empty() => log::info!(
                    "release {release} component {}: generation(s) {removed:?} removed (keeping {keep})",
                    r.name
                ),
                Ok(_) => {}
                Err(e) => log::warn!(
                    "release {release} component {}: removing old generations: {e}",
                    r.name
                ),
            }
            done.push(format!(
                "{} {} (generation {}, {} bytes downloaded)",
                r.name,
                r.version,
                r.generation.unwrap_or(0),
                r.bytes
            ));
        }
        Ok(done)
    }

    /// How `job` ended (history `event`, report `result`), in one
    /// transaction with the end of `components_job`.
    fn components_ended(
        &self,
        event: &str,
        result: &str,
        job: &ComponentsJob,
        detail: &str,
    ) -> Result<()> {
        let took = Timestamp::now().0.saturating_sub(job.started.0).max(0) as u64;
        let report = self.server.takes(report::COMPONENTS).then(|| {
            report::components_result(
                &self.device_id,
                self.booted,
                &job.release,
                job.serial,
                result,
                &job.components,
                took,
                Some(detail),
            )
        });
        self.store.atomically(|s| {
            s.add_history(&Event {
                event,
                release: Some(&job.release),
                slot: None,
                detail: Some(detail),
            })?;
            if let Some(r) = &report {
                s.push_report(&r.as_report())?;
            }
            s.set(JOB_KEY, "")
        })
    }

    /// At start: a release of components that a power cut or a crash
    /// interrupted is undone, every app back on the generation it ran
    /// before. The release is installed again from the next poll.
    pub(super) fn recover_components(&mut self, t: &mut dyn Ticker) -> Result<()> {
        let Some(job) = self.components_job()? else {
            return Ok(());
        };
        self.undo_components(&job, t);
        let detail = "interrupted before its commit (power cut or crash); \
                      every app is back on the generation it ran before";
        self.components_ended("interrupted", "interrupted", &job, detail)?;
        log::warn!("release {}: {detail}", job.release);
        Ok(())
    }
}

/// Run `f` with the blobs of tree `tp`: from its pack when the release
/// offers one (a bundle, a fleet server's module), else from its blobs
/// directory; what it returned, and the bytes read.
fn with_blobs<R>(
    src: &mut Source,
    packed: bool,
    tp: &TreePart,
    index: &Index,
    f: impl FnOnce(&mut dyn crate::app::tree::Blobs) -> Result<R>,
) -> Result<(R, u64)> {
    if packed {
        let mut blobs = PackBlobs::new(src, &tp.index, index)?;
        let r = f(&mut blobs)?;
        Ok((r, blobs.read_bytes))
    } else {
        let mut blobs = SourceBlobs::new(src, &tp.blobs);
        let r = f(&mut blobs)?;
        Ok((r, blobs.read_bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::Artifact;

    fn app(name: &str, content: &[u8]) -> Component {
        Component {
            name: name.into(),
            version: "1.0".into(),
            part: Part::App(TreePart {
                tree: crate::manifest::component::TreeSize {
                    entries: 1,
                    bytes: 1,
                },
                index: Artifact {
                    url: "i".into(),
                    size: 1,
                    sha256: Sha256::of(content),
                    frames: vec![],
                },
                blobs: "b/".into(),
            }),
        }
    }

    fn configured(name: &str, kind: CKind) -> ComponentConfig {
        ComponentConfig {
            name: name.into(),
            kind,
            units: vec![],
            health_dir: None,
            keep: 2,
            handler: vec![],
            timeout: crate::config::Dur(Duration::from_secs(60)),
            slot_dirs: None,
        }
    }

    fn boot(name: &str, content: &[u8]) -> Component {
        let mut c = app(name, content);
        if let Part::App(t) = c.part {
            c.part = Part::Boot(t);
        }
        c
    }

    #[test]
    fn a_slots_job_writes_its_boot_files_even_when_they_run_already() {
        let c = [boot("firmware", b"1"), app("web", b"1"), app("db", b"2")];
        assert_eq!(
            with_the_slot(&c, Plan::Unchanged),
            [&c[0]],
            "the other slot's directory holds another release's files"
        );
        assert_eq!(
            with_the_slot(&c, Plan::Install(vec![&c[2]])),
            [&c[0], &c[2]]
        );
        assert_eq!(with_the_slot(&c, Plan::WithSlot(vec![&c[0]])), [&c[0]]);
        let apps = [app("web", b"1")];
        assert!(with_the_slot(&apps, Plan::Unchanged).is_empty());
    }

    #[test]
    fn changed_boot_files_need_the_slot_installed_with_them() {
        let c = [boot("firmware", b"2"), app("web", b"1")];
        let (f, w) = (
            configured("firmware", CKind::Boot),
            configured("web", CKind::App),
        );
        let running = |content: &'static [u8], cfg| Known {
            configured: Some(cfg),
            running: Some(("1.0", Sha256::of(content))),
            rejected: None,
        };
        let k = [running(b"1", &f), running(b"1", &w)];
        assert_eq!(plan(&c, &k, false), Ok(Plan::WithSlot(vec![&c[0]])));
        // Unchanged boot files never ask for a boot.
        let c = [boot("firmware", b"1"), app("web", b"2")];
        assert_eq!(plan(&c, &k, false), Ok(Plan::Install(vec![&c[1]])));
        // Boot files rolled back here before decline the release.
        let c = [boot("firmware", b"2"), app("web", b"1")];
        let mut k = [running(b"1", &f), running(b"1", &w)];
        k[0].rejected = Some(Sha256::of(b"2"));
        assert!(matches!(plan(&c, &k, false), Ok(Plan::Declined(_))));
    }

    #[test]
    fn a_component_runs_unchanged_when_its_content_runs() {
        let c = [app("web", b"1")];
        let cfg = configured("web", CKind::App);
        let k = [Known {
            configured: Some(&cfg),
            running: Some(("1.0", Sha256::of(b"1"))),
            rejected: None,
        }];
        assert_eq!(plan(&c, &k, false), Ok(Plan::Unchanged));
    }

    #[test]
    fn only_the_components_that_change_are_installed() {
        let c = [app("web", b"2"), app("db", b"1")];
        let (w, d) = (configured("web", CKind::App), configured("db", CKind::App));
        let k = [
            Known {
                configured: Some(&w),
                running: Some(("1.0", Sha256::of(b"1"))),
                rejected: None,
            },
            Known {
                configured: Some(&d),
                running: Some(("1.0", Sha256::of(b"1"))),
                rejected: None,
            },
        ];
        assert_eq!(plan(&c, &k, false), Ok(Plan::Install(vec![&c[0]])));
    }

    #[test]
    fn a_component_never_installed_here_is_installed() {
        let c = [app("web", b"1")];
        let cfg = configured("web", CKind::App);
        let k = [Known {
            configured: Some(&cfg),
            running: None,
            rejected: None,
        }];
        assert_eq!(plan(&c, &k, false), Ok(Plan::Install(vec![&c[0]])));
    }

    #[test]
    fn an_unconfigured_component_refuses_the_release() {
        let c = [app("web", b"1")];
        let k = [Known {
            configured: None,
            running: None,
            rejected: None,
        }];
        let why = plan(&c, &k, false).unwrap_err();
        assert!(why.contains("[components.web]"), "{why}");
    }

    #[test]
    fn a_kind_other_than_configured_refuses_the_release() {
        let c = [app("web", b"1")];
        let cfg = configured("web", CKind::Command);
        let k = [Known {
            configured: Some(&cfg),
            running: None,
            rejected: None,
        }];
        let why = plan(&c, &k, false).unwrap_err();
        assert!(why.contains("configured as command"), "{why}");
    }

    #[test]
    fn a_rolled_back_content_is_declined_unless_the_operator_asks() {
        let c = [app("web", b"2")];
        let cfg = configured("web", CKind::App);
        let k = [Known {
            configured: Some(&cfg),
            running: Some(("1.0", Sha256::of(b"1"))),
            rejected: Some(Sha256::of(b"2")),
        }];
        assert!(matches!(plan(&c, &k, false), Ok(Plan::Declined(_))));
        assert_eq!(plan(&c, &k, true), Ok(Plan::Install(vec![&c[0]])));
    }
}
