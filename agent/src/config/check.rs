//! The checks across keys: what each key cannot say alone (a DDI server
//! without its URL, a rate cap below the download floor, a boot script
//! without its path). [`Config::check_boot`] is the part about selecting
//! the boot, which degraded mode runs on its own.
//!
//! This file never reads the file system: paths are checked where they are
//! opened.

use super::*;

/// The highest partition number a Raspberry Pi boot partition can have
/// (GPT's usual 128 entries; MBR has 4).
const MAX_BOOT_PARTITION: u32 = 128;

impl Config {
    pub(super) fn check(&self) -> Result<()> {
        let bad = |key: &str, why: String| Err(Error::new(Kind::Config, format!("{key}: {why}")));
        let s = &self.server;
        for (key, url) in std::iter::once(("server.manifest_url", &s.manifest_url))
            .chain(std::iter::once(("server.report_url", &s.report_url)))
            .chain(s.mirrors.iter().map(|m| ("server.mirrors", m)))
        {
            if url.is_empty() && key != "server.mirrors" {
                continue;
            }
            if url.starts_with("http://") {
                if !s.insecure_allow_http {
                    return bad(
                        key,
                        format!(
                            "{url:?} is plain http; use https (server.insecure_allow_http = true is for development only)"
                        ),
                    );
                }
            } else if !url.starts_with("https://") {
                return bad(key, format!("{url:?} is not an https URL"));
            }
            if let Some(at) = url.find(CHANNEL_PLACEHOLDER) {
                let authority_end = url
                    .find("://")
                    .and_then(|i| url[i + 3..].find('/').map(|j| i + 3 + j));
                if key == "server.report_url" || authority_end.is_none_or(|end| at < end) {
                    return bad(
                        key,
                        format!(
                            "{url:?}: {CHANNEL_PLACEHOLDER} may stand only in the path of server.manifest_url and server.mirrors"
                        ),
                    );
                }
            }
        }
        match s.kind {
            ServerKind::Static => {
                if !s.ddi_url.is_empty() || !s.controller_id.is_empty() {
                    return bad(
                        if s.ddi_url.is_empty() {
                            "server.controller_id"
                        } else {
                            "server.ddi_url"
                        },
                        "is for a DDI server: set server.kind = \"hawkbit\" as well".into(),
                    );
                }
            }
            ServerKind::Hawkbit => {
                for (key, set) in [
                    ("server.manifest_url", !s.manifest_url.is_empty()),
                    ("server.report_url", !s.report_url.is_empty()),
                    ("server.mirrors", !s.mirrors.is_empty()),
                ] {
                    if set {
                        return bad(
                            key,
                            "is for kind = \"static\": a DDI server names the release's files in each deployment and takes reports as action feedback".into(),
                        );
                    }
                }
                let url = &s.ddi_url;
                if url.is_empty() {
                    return bad(
                        "server.ddi_url",
                        "is required with kind = \"hawkbit\" (e.g. \"https://hawkbit.example.com\")".into(),
                    );
                }
                if url.starts_with("http://") {
                    if !s.insecure_allow_http {
                        return bad(
                            "server.ddi_url",
                            format!(
                                "{url:?} is plain http; use https (server.insecure_allow_http = true is for development only)"
                            ),
                        );
                    }
                } else if !url.starts_with("https://") {
                    return bad("server.ddi_url", format!("{url:?} is not an https URL"));
                }
                let rest = url.split_once("://").map_or("", |(_, r)| r);
                let authority = rest.split('/').next().unwrap_or("");
                if authority.is_empty()
                    || authority.contains('@')
                    || url.contains(['?', '#'])
                    || url.chars().any(|c| c.is_whitespace() || c.is_control())
                {
                    return bad(
                        "server.ddi_url",
                        format!(
                            "{url:?} must be scheme, host, optional port and path, without credentials, query or fragment"
                        ),
                    );
                }
                for (key, v) in [
                    ("server.tenant", &s.tenant),
                    ("server.controller_id", &s.controller_id),
                ] {
                    if key == "server.controller_id" && v.is_empty() {
                        continue;
                    }
                    if !crate::ddi::is_path_token(v) {
                        return bad(
                            key,
                            format!(
                                "{v:?} must be 1 to 128 letters, digits, '.', '_', '-' or ':' (it is a segment of the DDI paths)"
                            ),
                        );
                    }
                }
                if s.ddi_sleep_min.0 < Duration::from_secs(1)
                    || s.ddi_sleep_max.0 < s.ddi_sleep_min.0
                {
                    return bad(
                        "server.ddi_sleep_min",
                        "must be at least 1s and not above server.ddi_sleep_max".into(),
                    );
                }
                if s.ddi_auth == DdiAuth::None && s.token_file.is_some() {
                    return bad(
                        "server.token_file",
                        "is set but server.ddi_auth = \"none\" sends no token".into(),
                    );
                }
            }
        }
        if let Err(why) = crate::manifest::check_channel_name(&s.channel) {
            return bad("server.channel", why);
        }
        if s.poll_interval.0 < Duration::from_secs(1) {
            return bad("server.poll_interval", "must be at least 1s".into());
        }
        if s.jitter() > s.poll_interval.0 {
            return bad(
                "server.poll_jitter",
                "must not exceed server.poll_interval".into(),
            );
        }
        if s.download_allowance.0 < Duration::from_secs(1) {
            return bad(
                "server.download_allowance",
                "must be at least 1s (a download's deadline is download_allowance + signed size / download_min_average_rate)".into(),
            );
        }
        if s.download_min_average_rate == 0 {
            return bad(
                "server.download_min_average_rate",
                "must be at least 1 (bytes/s): a download's deadline is download_allowance + signed size / download_min_average_rate".into(),
            );
        }
        for (gate, key) in [
            self.policy.switch_gate(),
            (self.policy.write, "policy.write"),
        ] {
            if gate == Gate::Window && self.policy.windows.0.is_empty() {
                return bad(
                    key,
                    "\"window\" needs at least one window in policy.windows".into(),
                );
            }
        }
        if self.policy.window_rate.is_some() && self.policy.windows.0.is_empty() {
            return bad(
                "policy.window_rate",
                "needs at least one window in policy.windows".into(),
            );
        }
        for (cap, key) in [
            (self.policy.max_rate, "policy.max_rate"),
            (self.policy.window_rate, "policy.window_rate"),
        ] {
            let Some(cap) = cap else { continue };
            if cap < s.min_rate.max(1) {
                return bad(
                    key,
                    format!(
                        "{cap} bytes/s is below server.min_rate ({} bytes/s), the slow-retrieval floor: every capped download would be abandoned",
                        s.min_rate
                    ),
                );
            }
        }
        if s.client_cert.is_some() != s.client_key.is_some() {
            return bad(
                "server.client_cert",
                "client_cert and client_key go together".into(),
            );
        }
        if self.device.compatible.is_empty() {
            return bad("device.compatible", "must not be empty".into());
        }
        let t = &self.trust;
        match (t.root_keys.is_empty(), t.keys.is_empty()) {
            (true, true) => return bad("trust", "set root_keys (root mode) or keys (simple mode)".into()),
            (false, false) => return bad("trust", "root_keys and keys are exclusive: root keys sign key documents that list the release keys".into()),
            _ => {}
        }
        self.check_boot()?;
        let b = &self.bootloader;
        if self.system.reboot == RebootMode::Auto && self.system.reboot_command.is_empty() {
            return bad(
                "system.reboot_command",
                if b.kind == BootloaderKind::File {
                    "is required with bootloader.kind = \"file\" (a development bootloader has no default reboot command: name the command that restarts this device, or set system.reboot = \"manual\")".into()
                } else {
                    "is empty but reboot = \"auto\"".into()
                },
            );
        }
        if self.system.sync_bytes < 1024 * 1024 {
            return bad("system.sync_bytes", "must be at least 1 MiB".into());
        }
        Ok(())
    }

    /// The checks of what selects the boot (slots and bootloader), on
    /// their own: a daemon that cannot start for another reason still
    /// keeps the booted slot good with them ([`Config::load_unchecked`]).
    pub fn check_boot(&self) -> Result<()> {
        let bad = |key: &str, why: String| Err(Error::new(Kind::Config, format!("{key}: {why}")));
        if self.slots.a == self.slots.b {
            return bad(
                "slots.b",
                format!("is the same path as slots.a ({})", self.slots.a.display()),
            );
        }
        let b = &self.bootloader;
        if b.tries == 0 || b.tries > 255 {
            return bad(
                "bootloader.tries",
                format!("{} is not between 1 and 255", b.tries),
            );
        }
        if b.kind == BootloaderKind::Uboot && b.tries > 9 {
            // Boot scripts count with `setexpr` (hexadecimal) and compare
            // with `test -gt` (decimal): counts above 9 go wrong.
            return bad(
                "bootloader.tries",
                format!(
                    "{} is more than 9, which U-Boot boot scripts cannot count",
                    b.tries
                ),
            );
        }
        if b.kind == BootloaderKind::Script && b.script.is_none() {
            return bad(
                "bootloader.script",
                "is required when kind = \"script\"".into(),
            );
        }
        match (b.flow, b.kind) {
            (BootFlow::Updraft, _)
            | (BootFlow::Rauc, BootloaderKind::Uboot | BootloaderKind::Grub)
            | (BootFlow::Mender, BootloaderKind::Uboot | BootloaderKind::Grub) => {}
            (BootFlow::Rauc, _) => {
                return bad(
                    "bootloader.flow",
                    "RAUC's variables are kept with kind = \"uboot\" or \"grub\"".into(),
                );
            }
            (BootFlow::Mender, _) => {
                return bad(
                    "bootloader.flow",
                    "Mender's variables are kept with kind = \"uboot\" or \"grub\"".into(),
                );
            }
        }
        if b.flow != BootFlow::Rauc && (b.bootname_a != "A" || b.bootname_b != "B") {
            return bad(
                "bootloader.bootname_a",
                "bootnames are RAUC's: set flow = \"rauc\" too".into(),
            );
        }
        for (key, name) in [
            ("bootloader.bootname_a", &b.bootname_a),
            ("bootloader.bootname_b", &b.bootname_b),
        ] {
            if name.is_empty()
                || name.len() > 32
                || !name.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_')
            {
                return bad(
                    key,
                    format!("{name:?} is not a bootname (1 to 32 letters, digits or _)"),
                );
            }
        }
        if b.bootname_a == b.bootname_b {
            return bad(
                "bootloader.bootname_b",
                format!("is slot A's bootname too ({})", b.bootname_a),
            );
        }
        if b.kind == BootloaderKind::RpiTryboot || b.flow == BootFlow::Mender {
            if b.kind == BootloaderKind::RpiTryboot && b.autoboot.is_none() {
                return bad(
                    "bootloader.autoboot",
                    "is required when kind = \"rpi-tryboot\" (autoboot.txt on the mounted first FAT partition)".into(),
                );
            }
            for (key, p) in [
                ("bootloader.boot_partition_a", b.boot_partition_a),
                ("bootloader.boot_partition_b", b.boot_partition_b),
            ] {
                if p == 0 || p > MAX_BOOT_PARTITION {
                    return bad(
                        key,
                        format!("{p} is not a partition number from 1 to {MAX_BOOT_PARTITION}"),
                    );
                }
            }
            if b.boot_partition_a == b.boot_partition_b {
                return bad(
                    "bootloader.boot_partition_b",
                    format!("is slot A's partition too ({})", b.boot_partition_a),
                );
            }
        }
        Ok(())
    }
}
