//! Reading the configuration's tables into a [`Config`]: every section's
//! keys with their types and defaults, an unknown key refused with its
//! section and line ([`Section`]).
//!
//! This file knows the keys; it checks nothing across keys (that is
//! [`super::check`]) and opens nothing.

use super::*;

impl Config {
    pub(super) fn from_tables(tables: &[Table]) -> Result<Config> {
        const SECTIONS: [&str; 12] = [
            "server",
            "device",
            "trust",
            "slots",
            "bootloader",
            "health",
            "system",
            "policy",
            "apps",
            "rollback",
            "provenance",
            "components.NAME",
        ];
        for t in tables {
            if let Some(name) = t.name.strip_prefix("components.") {
                crate::manifest::component::check_name(name).map_err(|e| {
                    Error::new(Kind::Config, format!("line {}: [{}]: {e}", t.line, t.name))
                })?;
                continue;
            }
            if t.name.is_empty() {
                if let Some(e) = t.entries.first() {
                    return Err(Error::new(
                        Kind::Config,
                        format!(
                            "line {}: key {} is outside any section ([{}])",
                            e.line,
                            e.key,
                            SECTIONS.join("], [")
                        ),
                    ));
                }
            } else if !SECTIONS.contains(&t.name.as_str()) {
                return Err(Error::new(
                    Kind::Config,
                    format!(
                        "line {}: unknown section [{}] (sections: [{}])",
                        t.line,
                        t.name,
                        SECTIONS.join("], [")
                    ),
                ));
            }
        }
        let section =
            |name: &'static str| Section::new(name, tables.iter().find(|t| t.name == name));
        let mut s = section("server");
        let d = Server::default();
        let server = Server {
            kind: s
                .choice(
                    "kind",
                    &[
                        ("static", ServerKind::Static),
                        ("hawkbit", ServerKind::Hawkbit),
                    ],
                )?
                .unwrap_or(d.kind),
            manifest_url: s.string("manifest_url")?.unwrap_or(d.manifest_url),
            channel: s.string("channel")?.unwrap_or(d.channel),
            ca_file: s.path("ca_file")?,
            system_roots: s.boolean("system_roots")?.unwrap_or(d.system_roots),
            mirrors: s.strings("mirrors")?.unwrap_or(d.mirrors),
            report_url: s.string("report_url")?.unwrap_or(d.report_url),
            poll_interval: s.duration("poll_interval")?.unwrap_or(d.poll_interval),
            poll_jitter: s.duration("poll_jitter")?,
            heartbeat_interval: s
                .duration("heartbeat_interval")?
                .unwrap_or(d.heartbeat_interval),
            retry_max: s.duration("retry_max")?.unwrap_or(d.retry_max),
            stale_limit: s.duration("stale_limit")?.unwrap_or(d.stale_limit),
            connect_timeout: s.duration("connect_timeout")?.unwrap_or(d.connect_timeout),
            stall_timeout: s.duration("stall_timeout")?.unwrap_or(d.stall_timeout),
            min_rate: s.unsigned("min_rate")?.unwrap_or(d.min_rate),
            min_rate_window: s.duration("min_rate_window")?.unwrap_or(d.min_rate_window),
            download_allowance: s
                .duration("download_allowance")?
                .unwrap_or(d.download_allowance),
            download_min_average_rate: s
                .unsigned("download_min_average_rate")?
                .unwrap_or(d.download_min_average_rate),
            client_cert: s.path("client_cert")?,
            client_key: s.path("client_key")?,
            token_file: s.path("token_file")?,
            insecure_allow_http: s
                .boolean("insecure_allow_http")?
                .unwrap_or(d.insecure_allow_http),
            ddi_url: s.string("ddi_url")?.unwrap_or(d.ddi_url),
            tenant: s.string("tenant")?.unwrap_or(d.tenant),
            controller_id: s.string("controller_id")?.unwrap_or(d.controller_id),
            ddi_auth: s
                .choice(
                    "ddi_auth",
                    &[
                        ("target_token", DdiAuth::TargetToken),
                        ("gateway_token", DdiAuth::GatewayToken),
                        ("none", DdiAuth::None),
                    ],
                )?
                .unwrap_or(d.ddi_auth),
            ddi_sleep_min: s.duration("ddi_sleep_min")?.unwrap_or(d.ddi_sleep_min),
            ddi_sleep_max: s.duration("ddi_sleep_max")?.unwrap_or(d.ddi_sleep_max),
        };
        s.finish()?;

        let mut s = section("device").required()?;
        let device = Device {
            compatible: s.required_string("compatible")?,
            id_file: s.path("id_file")?.unwrap_or_else(default_id_file),
            release_file: s.path("release_file")?.unwrap_or_else(default_release_file),
        };
        s.finish()?;

        let mut s = section("trust").required()?;
        let trust = TrustConfig {
            root_keys: s.paths("root_keys")?.unwrap_or_default(),
            keys: s.paths("keys")?.unwrap_or_default(),
            threshold: s
                .unsigned("threshold")?
                .map(|v| v as usize)
                .unwrap_or_else(one),
            keys_version: s.unsigned("keys_version")?.unwrap_or(0),
        };
        s.finish()?;

        let mut s = section("slots").required()?;
        let slots = Slots {
            a: PathBuf::from(s.required_string("a")?),
            b: PathBuf::from(s.required_string("b")?),
            cmdline: s.path("cmdline")?.unwrap_or_else(default_cmdline),
        };
        s.finish()?;

        let mut s = section("bootloader");
        let d = Bootloader::default();
        let bootloader = Bootloader {
            kind: s
                .choice(
                    "kind",
                    &[
                        ("uboot", BootloaderKind::Uboot),
                        ("grub", BootloaderKind::Grub),
                        ("file", BootloaderKind::File),
                        ("script", BootloaderKind::Script),
                        ("rpi-tryboot", BootloaderKind::RpiTryboot),
                    ],
                )?
                .unwrap_or(d.kind),
            flow: s
                .choice(
                    "flow",
                    &[
                        ("updraft", BootFlow::Updraft),
                        ("rauc", BootFlow::Rauc),
                        ("mender", BootFlow::Mender),
                    ],
                )?
                .unwrap_or(d.flow),
            bootname_a: s.string("bootname_a")?.unwrap_or(d.bootname_a),
            bootname_b: s.string("bootname_b")?.unwrap_or(d.bootname_b),
            tries: s.unsigned_u32("tries")?.unwrap_or(d.tries),
            path: s.path("path")?.unwrap_or(d.path),
            fw_env_config: s.path("fw_env_config")?.unwrap_or(d.fw_env_config),
            lock_file: s.path("lock_file")?.unwrap_or(d.lock_file),
            grubenv: s.path("grubenv")?.unwrap_or(d.grubenv),
            mender_grubenv: s.path("mender_grubenv")?.unwrap_or(d.mender_grubenv),
            script: s.path("script")?,
            autoboot: s.path("autoboot")?,
            boot_partition_a: s
                .unsigned_u32("boot_partition_a")?
                .unwrap_or(d.boot_partition_a),
            boot_partition_b: s
                .unsigned_u32("boot_partition_b")?
                .unwrap_or(d.boot_partition_b),
            device_tree: s.path("device_tree")?.unwrap_or(d.device_tree),
        };
        s.finish()?;

        let mut s = section("health");
        let d = Health::default();
        let health = Health {
            checks_dir: s.path("checks_dir")?.unwrap_or(d.checks_dir),
            required_units: s.strings("required_units")?.unwrap_or(d.required_units),
            timeout: s.duration("timeout")?.unwrap_or(d.timeout),
            check_timeout: s.duration("check_timeout")?.unwrap_or(d.check_timeout),
            check_server: s.boolean("check_server")?.unwrap_or(d.check_server),
        };
        s.finish()?;

        let mut s = section("system");
        let d = System::default();
        let system = System {
            reboot: s
                .choice(
                    "reboot",
                    &[("auto", RebootMode::Auto), ("manual", RebootMode::Manual)],
                )?
                .unwrap_or(d.reboot),
            // The `file` bootloader is for development and demos, run on
            // workstations: it has no default reboot command, so trying it
            // never reboots the machine it is tried on.
            reboot_command: s.strings("reboot_command")?.unwrap_or_else(|| {
                if bootloader.kind == BootloaderKind::File {
                    Vec::new()
                } else {
                    d.reboot_command
                }
            }),
            boot_id_file: s.path("boot_id_file")?.unwrap_or(d.boot_id_file),
            state_dir: s.path("state_dir")?.unwrap_or(d.state_dir),
            socket: s.path("socket")?.unwrap_or(d.socket),
            socket_group: s.string("socket_group")?,
            metrics_file: s.path("metrics_file")?,
            sync_bytes: s.unsigned("sync_bytes")?.unwrap_or(d.sync_bytes),
            readback: s.boolean("readback")?.unwrap_or(d.readback),
            reboot_timeout: s.duration("reboot_timeout")?.unwrap_or(d.reboot_timeout),
            degraded_retry: s.duration("degraded_retry")?.unwrap_or(d.degraded_retry),
        };
        s.finish()?;

        let mut s = section("policy");
        let d = Policy::default();
        let gates = [
            ("auto", Gate::Auto),
            ("window", Gate::Window),
            ("manual", Gate::Manual),
        ];
        let policy = Policy {
            max_rate: s.rate("max_rate")?,
            window_rate: s.rate("window_rate")?,
            write: s.choice("write", &gates)?.unwrap_or(d.write),
            switch: s.choice("switch", &gates)?.unwrap_or(d.switch),
            reboot: s.choice("reboot", &gates)?.unwrap_or(d.reboot),
            windows: s.windows("windows")?.unwrap_or(d.windows),
            boot_time: s.duration("boot_time")?.unwrap_or(d.boot_time),
            inhibit_dir: s.path("inhibit_dir")?.unwrap_or(d.inhibit_dir),
            inhibit_group: s.string("inhibit_group")?,
            logind: s.boolean("logind")?.unwrap_or(d.logind),
            logind_dir: s.path("logind_dir")?.unwrap_or(d.logind_dir),
            inhibit_command: s.strings("inhibit_command")?,
            server_may_force: s.boolean("server_may_force")?.unwrap_or(d.server_may_force),
            // A bare "0" is the one number without a unit accepted here:
            // it switches the limit off, as "0s" does.
            max_deferral: match s.get("max_deferral").map(|e| &e.value) {
                Some(Value::String(t)) if t.trim() == "0" => None,
                _ => s
                    .duration("max_deferral")?
                    .map_or(d.max_deferral, |v| (!v.0.is_zero()).then_some(v)),
            },
        };
        if let Some(argv) = &policy.inhibit_command {
            if argv.first().is_none_or(String::is_empty) {
                let why = if argv.is_empty() {
                    "is empty; leave the key out to ask no command"
                } else {
                    "names no program (its first element is empty)"
                };
                return Err(match s.get("inhibit_command").cloned() {
                    Some(e) => s.bad(&e, why),
                    None => Error::new(Kind::Config, format!("policy.inhibit_command: {why}")),
                });
            }
        }
        s.finish()?;

        let mut server = server;
        if server.kind == ServerKind::Hawkbit
            && server.token_file.is_none()
            && server.ddi_auth != DdiAuth::None
        {
            server.token_file = Some(system.state_dir.join(DDI_TOKEN_FILE));
        }
        let mut s = section("apps");
        let d = Apps::default();
        let apps = Apps {
            dir: s.path("dir")?.unwrap_or(d.dir),
            restart_command: s.strings("restart_command")?.unwrap_or(d.restart_command),
            restart_timeout: s.duration("restart_timeout")?.unwrap_or(d.restart_timeout),
        };
        if apps.restart_command.is_empty() {
            return Err(Error::new(
                Kind::Config,
                "apps.restart_command is empty (the default is [\"systemctl\", \"restart\"])",
            ));
        }
        s.finish()?;

        let rollback = rollback(section("rollback"))?;

        let mut s = section("provenance");
        let provenance = Provenance {
            builders: s.paths("builders")?.unwrap_or_default(),
            threshold: s
                .unsigned("threshold")?
                .map(|v| v as usize)
                .unwrap_or_else(one),
        };
        s.finish()?;

        let mut components = Vec::new();
        for t in tables {
            let Some(name) = t.name.strip_prefix("components.") else {
                continue;
            };
            components.push(component_config(name, t)?);
        }

        Ok(Config {
            server,
            device,
            trust,
            slots,
            bootloader,
            health,
            system,
            policy,
            apps,
            rollback,
            components,
            provenance,
        })
    }
}

/// `[rollback]`: each counter's keys, and only its keys.
fn rollback(mut s: Section<'_>) -> Result<Rollback> {
    let d = Rollback::default();
    let kinds = [
        ("none", CounterKind::None),
        ("tpm2", CounterKind::Tpm2),
        ("command", CounterKind::Command),
    ];
    let counter = s.choice("counter", &kinds)?.unwrap_or(d.counter);
    let nv_index = match s.get("nv_index").cloned() {
        None => None,
        Some(e) => {
            let parsed = match &e.value {
                Value::Integer(n) => u32::try_from(*n).ok(),
                Value::String(t) => t
                    .strip_prefix("0x")
                    .and_then(|h| u32::from_str_radix(h, 16).ok()),
                _ => None,
            };
            match parsed {
                Some(i) if nv_index_ok(i) => Some(i),
                _ => {
                    return Err(s.bad(
                        &e,
                        "is not an NV index: a handle from 0x01000000 to 0x01ffffff, as \"0x1500016\"",
                    ));
                }
            }
        }
    };
    let tcti = s.string("tcti")?;
    let access = s.choice(
        "access",
        &[("tools", TpmAccess::Tools), ("direct", TpmAccess::Direct)],
    )?;
    let read_command = s.strings("read_command")?;
    let advance_command = s.strings("advance_command")?;
    let on_unreadable = s
        .choice(
            "on_unreadable",
            &[
                ("refuse", OnUnreadable::Refuse),
                ("allow", OnUnreadable::Allow),
            ],
        )?
        .unwrap_or(d.on_unreadable);
    let wrong = |key: &str, kind: &str| {
        Err(Error::new(
            Kind::Config,
            format!("rollback.{key} is only used with counter = \"{kind}\""),
        ))
    };
    if counter != CounterKind::Tpm2 {
        if nv_index.is_some() {
            return wrong("nv_index", "tpm2");
        }
        if tcti.is_some() {
            return wrong("tcti", "tpm2");
        }
        if access.is_some() {
            return wrong("access", "tpm2");
        }
    }
    if counter != CounterKind::Command {
        if read_command.is_some() {
            return wrong("read_command", "command");
        }
        if advance_command.is_some() {
            return wrong("advance_command", "command");
        }
    }
    let program = |key: &str, argv: Option<Vec<String>>| match argv {
        Some(a) if a.first().is_some_and(|p| !p.is_empty()) => Ok(a),
        _ => Err(Error::new(
            Kind::Config,
            format!(
                "rollback.{key} is required with counter = \"command\" (a program and its arguments)"
            ),
        )),
    };
    let (read_command, advance_command) = if counter == CounterKind::Command {
        (
            program("read_command", read_command)?,
            program("advance_command", advance_command)?,
        )
    } else {
        (Vec::new(), Vec::new())
    };
    if tcti.as_deref().is_some_and(|t| t.trim().is_empty()) {
        return Err(Error::new(Kind::Config, "rollback.tcti is empty"));
    }
    let access = access.unwrap_or(d.access);
    let tcti = tcti.unwrap_or(d.tcti);
    if access == TpmAccess::Direct {
        tpm_transport(&tcti).map_err(|e| Error::new(Kind::Config, e))?;
    }
    s.finish()?;
    Ok(Rollback {
        counter,
        nv_index: nv_index.or((counter == CounterKind::Tpm2).then_some(DEFAULT_NV_INDEX)),
        tcti,
        access,
        read_command,
        advance_command,
        on_unreadable,
    })
}

/// One `[components.NAME]` table.
fn component_config(name: &str, t: &Table) -> Result<ComponentConfig> {
    use crate::manifest::component::Kind as C;
    let mut s = Section::new(t.name.clone(), Some(t));
    let kinds = [("app", C::App), ("boot", C::Boot), ("command", C::Command)];
    let kind = match s.choice("kind", &kinds)? {
        Some(k) => k,
        None => {
            return Err(Error::new(
                Kind::Config,
                format!(
                    "line {}: [{}] needs kind = \"app\", \"boot\" or \"command\" (the slot is [slots])",
                    t.line, t.name
                ),
            ));
        }
    };
    let c = ComponentConfig {
        name: name.to_string(),
        kind,
        units: s.strings("units")?.unwrap_or_default(),
        health_dir: s.path("health_dir")?,
        keep: s.unsigned("keep")?.map(|k| k as usize).unwrap_or(2),
        handler: s.strings("handler")?.unwrap_or_default(),
        timeout: s
            .duration("timeout")?
            .unwrap_or(Dur(std::time::Duration::from_secs(600))),
        slot_dirs: match (s.path("a")?, s.path("b")?) {
            (Some(a), Some(b)) => Some([a, b]),
            (None, None) => None,
            _ => {
                return Err(Error::new(
                    Kind::Config,
                    format!(
                        "line {}: {}: a and b go together (slot A's and slot B's boot files)",
                        t.line, t.name
                    ),
                ));
            }
        },
    };
    let wrong = |key: &str, why: &str| {
        Err(Error::new(
            Kind::Config,
            format!("line {}: {}.{key}: {why}", t.line, t.name),
        ))
    };
    match kind {
        C::App if c.keep < 2 => {
            return wrong(
                "keep",
                "at least 2 generations are kept (the active one and the one to roll back to)",
            );
        }
        C::App if !c.handler.is_empty() => {
            return wrong("handler", "only a command component has a handler");
        }
        C::Command if c.handler.is_empty() => {
            return wrong(
                "handler",
                "a command component needs its handler, e.g. [\"/usr/lib/updraft/handlers/file-copy\", \"/opt/fw.bin\"]",
            );
        }
        C::Command if !c.units.is_empty() || c.health_dir.is_some() => {
            return wrong("units", "units and health_dir are an app's");
        }
        C::Boot => {
            if !c.units.is_empty() || c.health_dir.is_some() || !c.handler.is_empty() {
                return wrong(
                    "units",
                    "boot files are tried with their slot: its health checks ([health]) decide, \
                     and they have no units, health_dir or handler",
                );
            }
            let Some([a, b]) = &c.slot_dirs else {
                return wrong(
                    "a",
                    "a boot component needs a and b, the directories of slot A's and slot B's boot files",
                );
            };
            if let Some(why) = boot_dirs_problem(a, b) {
                return wrong("a", &why);
            }
        }
        _ if c.slot_dirs.is_some() => {
            return wrong("a", "a and b are a boot component's");
        }
        _ => {}
    }
    s.finish()?;
    Ok(c)
}

/// Why slot A's and slot B's boot directories cannot be written one while
/// the other boots, if they cannot: each must be absolute and other than
/// `/`, and neither may hold the other.
fn boot_dirs_problem(a: &std::path::Path, b: &std::path::Path) -> Option<String> {
    for d in [a, b] {
        if !d.is_absolute() || d.parent().is_none() {
            return Some(format!(
                "{} must be an absolute directory other than /",
                d.display()
            ));
        }
    }
    if a.starts_with(b) || b.starts_with(a) {
        return Some(format!(
            "{} and {} overlap: writing one slot's boot files would change the other's",
            a.display(),
            b.display()
        ));
    }
    None
}

/// Reads one section's keys, remembering which were read so that anything
/// left over is reported as unknown.
struct Section<'a> {
    name: String,
    table: Option<&'a Table>,
    used: Vec<String>,
}

impl<'a> Section<'a> {
    fn new(name: impl Into<String>, table: Option<&'a Table>) -> Section<'a> {
        Section {
            name: name.into(),
            table,
            used: Vec::new(),
        }
    }

    fn required(self) -> Result<Section<'a>> {
        if self.table.is_none() {
            return Err(Error::new(
                Kind::Config,
                format!("section [{}] is missing", self.name),
            ));
        }
        Ok(self)
    }

    fn get(&mut self, key: &str) -> Option<&'a Entry> {
        self.used.push(key.to_string());
        self.table?.entries.iter().find(|e| e.key == key)
    }

    fn bad(&self, e: &Entry, why: impl std::fmt::Display) -> Error {
        Error::new(
            Kind::Config,
            format!("{}.{} (line {}): {why}", self.name, e.key, e.line),
        )
    }

    fn expected(&self, e: &Entry, what: &str) -> Error {
        self.bad(e, format!("expected {what}, found {}", e.value.type_name()))
    }

    fn string(&mut self, key: &str) -> Result<Option<String>> {
        match self.get(key) {
            None => Ok(None),
            Some(e) => match &e.value {
                Value::String(s) => Ok(Some(s.clone())),
                _ => Err(self.expected(e, "a string")),
            },
        }
    }

    fn required_string(&mut self, key: &str) -> Result<String> {
        self.string(key)?
            .ok_or_else(|| Error::new(Kind::Config, format!("{}.{key} is required", self.name)))
    }

    fn path(&mut self, key: &str) -> Result<Option<PathBuf>> {
        Ok(self.string(key)?.map(PathBuf::from))
    }

    fn strings(&mut self, key: &str) -> Result<Option<Vec<String>>> {
        match self.get(key) {
            None => Ok(None),
            Some(e) => match &e.value {
                Value::Array(items) => items
                    .iter()
                    .map(|v| match v {
                        Value::String(s) => Ok(s.clone()),
                        other => Err(self.bad(
                            e,
                            format!(
                                "expected an array of strings, found {} in it",
                                other.type_name()
                            ),
                        )),
                    })
                    .collect::<Result<Vec<_>>>()
                    .map(Some),
                _ => Err(self.expected(e, "an array of strings")),
            },
        }
    }

    fn paths(&mut self, key: &str) -> Result<Option<Vec<PathBuf>>> {
        Ok(self
            .strings(key)?
            .map(|v| v.into_iter().map(PathBuf::from).collect()))
    }

    fn boolean(&mut self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(e) => match &e.value {
                Value::Boolean(b) => Ok(Some(*b)),
                _ => Err(self.expected(e, "true or false")),
            },
        }
    }

    fn unsigned(&mut self, key: &str) -> Result<Option<u64>> {
        match self.get(key) {
            None => Ok(None),
            Some(e) => match &e.value {
                Value::Integer(n) if *n >= 0 => Ok(Some(*n as u64)),
                Value::Integer(n) => Err(self.bad(e, format!("{n} is negative"))),
                _ => Err(self.expected(e, "a whole number")),
            },
        }
    }

    /// A whole number that fits 32 bits (range checks follow).
    fn unsigned_u32(&mut self, key: &str) -> Result<Option<u32>> {
        let Some(v) = self.unsigned(key)? else {
            return Ok(None);
        };
        u32::try_from(v).map(Some).map_err(|_| match self.get(key) {
            Some(e) => self.bad(e, format!("{v} is too large")),
            None => Error::new(
                Kind::Config,
                format!("{}.{key}: {v} is too large", self.name),
            ),
        })
    }

    fn duration(&mut self, key: &str) -> Result<Option<Dur>> {
        match self.get(key) {
            None => Ok(None),
            Some(e) => match &e.value {
                Value::String(s) => parse_duration(s)
                    .map(|d| Some(Dur(d)))
                    .map_err(|err| self.bad(e, err)),
                _ => Err(self.expected(e, "a duration in quotes (e.g. \"30m\")")),
            },
        }
    }

    /// A list of maintenance windows, each checked (the error names the
    /// key, the line and the window).
    fn windows(&mut self, key: &str) -> Result<Option<Windows>> {
        let Some(list) = self.strings(key)? else {
            return Ok(None);
        };
        let mut out = Vec::new();
        for text in &list {
            match Window::parse(text) {
                Ok(w) => out.push(w),
                Err(why) => {
                    let e = self.get(key).cloned();
                    return Err(match e {
                        Some(e) => self.bad(&e, why),
                        None => Error::new(Kind::Config, format!("{}.{key}: {why}", self.name)),
                    });
                }
            }
        }
        Ok(Some(Windows(out)))
    }

    /// A rate in bytes/s: a whole number, or a string with a decimal
    /// (`k`, `M`, `G`) or binary (`Ki`, `Mi`, `Gi`) multiplier.
    fn rate(&mut self, key: &str) -> Result<Option<u64>> {
        match self.get(key) {
            None => Ok(None),
            Some(e) => {
                let v = match &e.value {
                    Value::Integer(n) if *n >= 0 => *n as u64,
                    Value::Integer(n) => return Err(self.bad(e, format!("{n} is negative"))),
                    Value::String(text) => parse_rate(text).map_err(|why| self.bad(e, why))?,
                    _ => {
                        return Err(self.expected(
                            e,
                            "bytes per second: a whole number or a string like \"4M\"",
                        ));
                    }
                };
                if v == 0 {
                    return Err(self.bad(
                        e,
                        "0 bytes/s would stop every download; leave the key out for no cap",
                    ));
                }
                Ok(Some(v))
            }
        }
    }

    fn choice<T: Copy>(&mut self, key: &str, options: &[(&str, T)]) -> Result<Option<T>> {
        let Some(v) = self.string(key)? else {
            return Ok(None);
        };
        match options.iter().find(|(name, _)| *name == v) {
            Some((_, t)) => Ok(Some(*t)),
            None => {
                let names: Vec<String> = options.iter().map(|(n, _)| format!("{n:?}")).collect();
                let e = self.get(key).cloned();
                let msg = format!("{v:?} is not one of {}", names.join(", "));
                Err(match e {
                    Some(e) => self.bad(&e, msg),
                    None => Error::new(Kind::Config, format!("{}.{key}: {msg}", self.name)),
                })
            }
        }
    }

    /// Every key of the section was read: anything else is unknown.
    fn finish(self) -> Result<()> {
        let Some(t) = self.table else {
            return Ok(());
        };
        if let Some(e) = t.entries.iter().find(|e| !self.used.contains(&e.key)) {
            let mut known = self.used.clone();
            known.sort();
            known.dedup();
            return Err(Error::new(
                Kind::Config,
                format!(
                    "line {}: unknown key {}.{} (keys of [{}]: {})",
                    e.line,
                    self.name,
                    e.key,
                    self.name,
                    known.join(", ")
                ),
            ));
        }
        Ok(())
    }
}
