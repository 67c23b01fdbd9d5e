//! The configuration file: `/etc/updraft/updraft.toml` unless `--config`.
//!
//! Every key is documented in `docs/configuration.md`. Parsing is strict:
//! an unknown key, a value of the wrong type or a duration that does not
//! parse is an error that names the key and the file, because a typo in a
//! device image must fail on the bench, not silently fall back to a default
//! in the field. This module only reads and checks; it opens nothing the
//! values point at, except the public key files it must parse.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{Error, Kind, Result};
use crate::timestamp::parse_duration;
use crate::toml_subset::{self, Entry, Table, Value};
use crate::trust::{Anchor, KeySet, PublicKey};
use crate::window::{Window, Windows};

mod check;
mod read;

pub const DEFAULT_PATH: &str = "/etc/updraft/updraft.toml";

/// A duration written as `30m`, `6h`, `90s`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dur(pub Duration);

#[derive(Debug, Clone)]
pub struct Config {
    pub server: Server,
    pub device: Device,
    pub trust: TrustConfig,
    pub slots: Slots,
    pub bootloader: Bootloader,
    pub health: Health,
    pub system: System,
    pub policy: Policy,
    pub apps: Apps,
    /// `[rollback]`: the hardware rollback floor.
    pub rollback: Rollback,
    /// `[components.NAME]`, in the file's order.
    pub components: Vec<ComponentConfig>,
    /// `[provenance]`: the builders whose attestation a release needs.
    pub provenance: Provenance,
}

/// `[provenance]`: the builder keys (PEM public key files) a release's
/// build provenance attestation must be signed by, and how many of them.
/// None configured: attestations are neither fetched nor required.
#[derive(Debug, Clone, Default)]
pub struct Provenance {
    pub builders: Vec<PathBuf>,
    pub threshold: usize,
}

/// `[apps]`: where applications live and how their units are restarted.
#[derive(Debug, Clone)]
pub struct Apps {
    /// `<dir>/<name>/` holds an app's generations, `current` and `data/`.
    pub dir: PathBuf,
    /// Run with an app's units appended to restart them after its
    /// generation is switched (`systemctl restart` by default).
    pub restart_command: Vec<String>,
    /// The longest the restart command may take.
    pub restart_timeout: Dur,
}

impl Default for Apps {
    fn default() -> Self {
        Apps {
            dir: PathBuf::from("/var/lib/updraft/apps"),
            restart_command: vec!["systemctl".into(), "restart".into()],
            restart_timeout: Dur(Duration::from_secs(120)),
        }
    }
}

/// `[rollback]`: the counter whose value is the lowest security version
/// this device installs (docs/security.md, "Hardware rollback floor").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rollback {
    pub counter: CounterKind,
    /// `tpm2`: the NV index of counter type.
    pub nv_index: Option<u32>,
    /// `tpm2`: how tpm2-tools reach the TPM (their `-T` option), or with
    /// `access = "direct"` where updraft sends the commands itself.
    pub tcti: String,
    /// `tpm2`: through tpm2-tools or directly.
    pub access: TpmAccess,
    /// `command`: prints the counter's value in decimal.
    pub read_command: Vec<String>,
    /// `command`: gets the target value appended.
    pub advance_command: Vec<String>,
    pub on_unreadable: OnUnreadable,
}

impl Default for Rollback {
    fn default() -> Self {
        Rollback {
            counter: CounterKind::None,
            nv_index: None,
            tcti: "device:/dev/tpmrm0".into(),
            access: TpmAccess::Tools,
            read_command: Vec::new(),
            advance_command: Vec::new(),
            on_unreadable: OnUnreadable::Refuse,
        }
    }
}

/// `rollback.nv_index` when none is configured: an index in the owner
/// range (0x01000000..0x01BFFFFF) whose value does not depend on a vendor.
pub const DEFAULT_NV_INDEX: u32 = 0x0150_0016;

/// NV indexes are 0x01xxxxxx handles.
pub fn nv_index_ok(index: u32) -> bool {
    index >> 24 == 0x01
}

/// `rollback.counter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CounterKind {
    None,
    Tpm2,
    Command,
}

/// `rollback.access`: how the `tpm2` counter reaches the TPM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TpmAccess {
    /// tpm2-tools' programs, given `tcti` with `-T`.
    Tools,
    /// updraft's own TPM 2.0 commands to `tcti`'s device or swtpm socket.
    Direct,
}

/// Where the commands go, from `rollback.tcti`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TpmTransport {
    /// A TPM character device (`/dev/tpmrm0`, `/dev/tpm0`).
    Device(PathBuf),
    /// swtpm's data channel on TCP.
    Tcp(String, u16),
    /// swtpm's data channel on a unix socket.
    Unix(PathBuf),
}

/// `rollback.tcti` as a direct transport: `device:PATH`,
/// `swtpm:host=H,port=P` (defaults `localhost`, 2321, as tpm2-tools have
/// them) or `swtpm:path=SOCKET`.
pub fn tpm_transport(tcti: &str) -> std::result::Result<TpmTransport, String> {
    let bad = |why: &str| format!("rollback.tcti {tcti:?} {why}");
    if let Some(path) = tcti.strip_prefix("device:") {
        if !path.starts_with('/') {
            return Err(bad("names no absolute device path (device:/dev/tpmrm0)"));
        }
        return Ok(TpmTransport::Device(PathBuf::from(path)));
    }
    let Some(conf) = tcti.strip_prefix("swtpm:") else {
        return Err(bad(
            "cannot be used with rollback.access = \"direct\": only device:PATH, swtpm:host=HOST,port=PORT or swtpm:path=SOCKET",
        ));
    };
    let (mut host, mut port, mut path) = ("localhost".to_string(), 2321u16, None);
    for kv in conf.split(',').filter(|s| !s.is_empty()) {
        match kv.split_once('=') {
            Some(("host", h)) if !h.is_empty() => host = h.to_string(),
            Some(("port", p)) => {
                port = p
                    .parse()
                    .ok()
                    .filter(|&p| p > 0)
                    .ok_or_else(|| bad(&format!("has port {p:?}, not a port number")))?;
            }
            Some(("path", p)) if p.starts_with('/') => path = Some(PathBuf::from(p)),
            _ => {
                return Err(bad(&format!(
                    "has {kv:?}: swtpm takes host=, port= or path=/…"
                )));
            }
        }
    }
    Ok(match path {
        Some(p) => TpmTransport::Unix(p),
        None => TpmTransport::Tcp(host, port),
    })
}

/// `rollback.on_unreadable`: what a counter that cannot be read means for
/// an install.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnUnreadable {
    Refuse,
    Allow,
}

/// `[components.NAME]`: a component this device installs besides its
/// slot. A release naming a component that is not configured here is
/// refused: the manifest never decides where bytes go or what runs.
#[derive(Debug, Clone)]
pub struct ComponentConfig {
    pub name: String,
    pub kind: crate::manifest::component::Kind,
    /// `app`: the systemd units restarted, in order, when a generation is
    /// activated or rolled back.
    pub units: Vec<String>,
    /// `app`: executables run after activation, like `health.checks_dir`
    /// (every executable file in it, in name order).
    pub health_dir: Option<PathBuf>,
    /// `app`: generations kept, the active one included (at least 2).
    pub keep: usize,
    /// `command`: the handler and its arguments; the phase is appended.
    pub handler: Vec<String>,
    /// `command`: the longest a phase may run; `app`: the longest its
    /// health checks may run together.
    pub timeout: Dur,
    /// `boot`: the directories holding slot A's and slot B's boot files
    /// (`a`, `b`): two directories of one boot partition, or the mount
    /// points of an A/B pair of boot partitions.
    pub slot_dirs: Option<[PathBuf; 2]>,
}

impl ComponentConfig {
    /// `boot`: the directory of `slot`'s boot files.
    pub fn slot_dir(&self, slot: crate::slot::SlotName) -> Option<&std::path::Path> {
        let dirs = self.slot_dirs.as_ref()?;
        Some(match slot {
            crate::slot::SlotName::A => &dirs[0],
            crate::slot::SlotName::B => &dirs[1],
        })
    }
}

impl Config {
    /// The configuration of component `name`, if the device has one.
    pub fn component(&self, name: &str) -> Option<&ComponentConfig> {
        self.components.iter().find(|c| c.name == name)
    }
}

#[derive(Debug, Clone)]
pub struct Server {
    /// What the daemon polls: a directory of static files
    /// (`manifest_url`), or a hawkBit DDI server (`ddi_url`).
    pub kind: ServerKind,
    /// Where the signed manifest is polled. Empty: the daemon never polls
    /// (local installs only).
    pub manifest_url: String,
    /// The release channel this device follows unless an operator chose
    /// another (`updraft channel`). `{channel}` in `manifest_url` and the
    /// mirrors stands for the channel followed.
    pub channel: String,
    /// Extra trust anchor (PEM) for TLS, added to the system roots.
    pub ca_file: Option<PathBuf>,
    /// Use the system's CA bundle as well (default true).
    pub system_roots: bool,
    /// Base URLs tried in order when the primary fails.
    pub mirrors: Vec<String>,
    /// Where reports are POSTed; empty keeps them queued.
    pub report_url: String,
    pub poll_interval: Dur,
    /// Spread of every poll around `poll_interval`, and of the first poll
    /// after start.
    pub poll_jitter: Option<Dur>,
    pub heartbeat_interval: Dur,
    /// How old a manifest of an earlier key epoch may be and still be
    /// waited out as a lagging edge; older ones are refused and reported.
    pub stale_limit: Dur,
    /// Cap of the exponential backoff after failures.
    pub retry_max: Dur,
    pub connect_timeout: Dur,
    /// No byte for this long on an open connection ends the transfer.
    pub stall_timeout: Dur,
    /// Slow-retrieval floor: a transfer slower than `min_rate` bytes/s over
    /// `min_rate_window` is abandoned.
    pub min_rate: u64,
    pub min_rate_window: Dur,
    /// Total download deadline of a job: `download_allowance` plus the
    /// signed size over `download_min_average_rate` (see
    /// [`Server::download_time`]).
    pub download_allowance: Dur,
    /// Bytes/s the whole download must average, retries included.
    pub download_min_average_rate: u64,
    /// PEM client certificate chain and key, for servers that want mTLS.
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
    /// File holding a bearer token sent as `Authorization: Bearer …`
    /// (`kind = "hawkbit"`: the DDI token, see [`Server::ddi_auth`]).
    pub token_file: Option<PathBuf>,
    /// Development only: allow plain `http://` URLs.
    pub insecure_allow_http: bool,
    /// `kind = "hawkbit"`: the DDI server's base URL (scheme, host, port
    /// and any path prefix before `/{tenant}/controller/v1/…`).
    pub ddi_url: String,
    /// `kind = "hawkbit"`: the tenant in the DDI paths.
    pub tenant: String,
    /// `kind = "hawkbit"`: this device's controller id; empty: the device
    /// id.
    pub controller_id: String,
    /// `kind = "hawkbit"`: how the device authenticates to the DDI server.
    pub ddi_auth: DdiAuth,
    /// `kind = "hawkbit"`: the bounds the server's `polling.sleep` is
    /// clamped to (a server cannot make a fleet poll more often, nor stay
    /// away longer).
    pub ddi_sleep_min: Dur,
    pub ddi_sleep_max: Dur,
}

/// What the daemon polls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerKind {
    /// A directory of static files: `manifest.json`, key documents,
    /// artifacts (any web server, object store or CDN).
    Static,
    /// A hawkBit DDI server (Eclipse hawkBit, gooseBit): it assigns
    /// releases; the signed manifest still decides what is installed.
    Hawkbit,
}

/// How a device authenticates to a DDI server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DdiAuth {
    /// `Authorization: TargetToken <token>`: the device's own token.
    TargetToken,
    /// `Authorization: GatewayToken <token>`: the tenant's gateway token.
    GatewayToken,
    /// No header: the server identifies the device by its TLS client
    /// certificate (`client_cert`, `client_key`), or not at all.
    None,
}

impl DdiAuth {
    /// The scheme of the `Authorization` header, if one is sent.
    pub fn scheme(self) -> Option<&'static str> {
        match self {
            DdiAuth::TargetToken => Some("TargetToken"),
            DdiAuth::GatewayToken => Some("GatewayToken"),
            DdiAuth::None => None,
        }
    }
}

/// The token file of a DDI device when `server.token_file` is not set:
/// on the data partition, because a per-device token cannot live in the
/// image both slots are written from.
pub const DDI_TOKEN_FILE: &str = "ddi-token";

/// The channel a device follows when its configuration names none.
pub const DEFAULT_CHANNEL: &str = "stable";

/// Stands for the followed channel in `manifest_url` and the mirrors.
pub const CHANNEL_PLACEHOLDER: &str = "{channel}";

impl Server {
    /// True when the manifest location follows the channel (the URL names
    /// `{channel}`), so the device can be moved to another channel.
    pub fn follows_channel_in_url(&self) -> bool {
        self.manifest_url.contains(CHANNEL_PLACEHOLDER)
    }

    /// Point `manifest_url` and the mirrors at `channel`. A channel other
    /// than the configured one needs `{channel}` in `manifest_url`:
    /// otherwise every manifest at the one URL would be refused.
    pub fn follow(&mut self, channel: &str) -> Result<()> {
        crate::manifest::check_channel_name(channel).map_err(|why| Error::new(Kind::Usage, why))?;
        if channel != self.channel && !self.follows_channel_in_url() {
            return Err(Error::new(
                Kind::Config,
                format!(
                    "server.manifest_url {:?} has no {CHANNEL_PLACEHOLDER} placeholder, so it serves only channel {}: \
                     following {channel} would refuse every manifest",
                    self.manifest_url, self.channel
                ),
            ));
        }
        self.manifest_url = self.manifest_url.replace(CHANNEL_PLACEHOLDER, channel);
        for m in &mut self.mirrors {
            *m = m.replace(CHANNEL_PLACEHOLDER, channel);
        }
        Ok(())
    }
}

impl Default for Server {
    fn default() -> Self {
        Server {
            kind: ServerKind::Static,
            manifest_url: String::new(),
            channel: DEFAULT_CHANNEL.into(),
            ca_file: None,
            system_roots: true,
            mirrors: Vec::new(),
            report_url: String::new(),
            poll_interval: Dur(Duration::from_secs(30 * 60)),
            poll_jitter: None,
            heartbeat_interval: Dur(Duration::from_secs(6 * 3600)),
            stale_limit: Dur(Duration::from_secs(24 * 3600)),
            retry_max: Dur(Duration::from_secs(6 * 3600)),
            connect_timeout: Dur(Duration::from_secs(30)),
            stall_timeout: Dur(Duration::from_secs(60)),
            min_rate: 256,
            min_rate_window: Dur(Duration::from_secs(120)),
            download_allowance: Dur(Duration::from_secs(3600)),
            download_min_average_rate: 4096,
            client_cert: None,
            client_key: None,
            token_file: None,
            insecure_allow_http: false,
            ddi_url: String::new(),
            tenant: "DEFAULT".into(),
            controller_id: String::new(),
            ddi_auth: DdiAuth::TargetToken,
            ddi_sleep_min: Dur(crate::ddi::MIN_SLEEP),
            ddi_sleep_max: Dur(crate::ddi::MAX_SLEEP),
        }
    }
}

impl Server {
    /// A DDI server's `polling.sleep` within `ddi_sleep_min` and
    /// `ddi_sleep_max`.
    pub fn clamp_sleep(&self, d: Duration) -> Duration {
        d.clamp(self.ddi_sleep_min.0, self.ddi_sleep_max.0)
    }

    /// Jitter window: configured, else a quarter of the poll interval.
    pub fn jitter(&self) -> Duration {
        match self.poll_jitter {
            Some(d) => d.0,
            None => self.poll_interval.0 / 4,
        }
    }
}

/// When and how fast an update may proceed: `[policy]`.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Cap on artifact downloads, bytes/s (`None`: as fast as the link
    /// goes). Manifests, key documents and reports are never slowed.
    pub max_rate: Option<u64>,
    /// The cap instead of `max_rate` for a download that starts (or
    /// resumes) while a maintenance window is open.
    pub window_rate: Option<u64>,
    /// When a new release may be downloaded and written into the inactive
    /// slot.
    pub write: Gate,
    /// When a verified slot may go first in the boot order.
    pub switch: Gate,
    /// When the daemon may reboot into it.
    pub reboot: Gate,
    /// Maintenance windows (`Gate::Window`).
    pub windows: Windows,
    /// What a trial boot needs besides `health.timeout` before the window
    /// closes: the time from the reboot command to the daemon's start.
    pub boot_time: Dur,
    /// Applications hold off the switch and reboot by putting a file here
    /// (its first line is the reason). Honoured only in a directory owned
    /// by root (or the daemon's user) that others cannot write, and only
    /// for files owned by root, the daemon's user or `inhibit_group`.
    pub inhibit_dir: PathBuf,
    /// Group whose members may inhibit through `inhibit_dir`. Resolved
    /// when the daemon starts, not here: an unknown group fails the start.
    pub inhibit_group: Option<String>,
    /// Also count systemd-logind `block` locks on `shutdown`.
    pub logind: bool,
    /// Where logind keeps its inhibitor files; only for tests and systems
    /// that keep logind's runtime state elsewhere.
    pub logind_dir: PathBuf,
    /// A program (argv) asked before a switch or reboot: exit status 0
    /// lets it go ahead, anything else holds it, with the first line of
    /// its output as the reason.
    pub inhibit_command: Option<Vec<String>>,
    /// How long inhibitors may hold an update back before they are
    /// overridden. Written as a duration (`24h`); `"0"` or `"0s"` reads as
    /// `None`: inhibitors may hold it forever.
    pub max_deferral: Option<Dur>,
    /// Whether a DDI server's `forced` passes a `manual` gate too. Off: a
    /// server may skip maintenance windows, never the local operator.
    pub server_may_force: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            max_rate: None,
            window_rate: None,
            write: Gate::Auto,
            switch: Gate::Auto,
            reboot: Gate::Auto,
            windows: Windows::default(),
            boot_time: Dur(Duration::from_secs(300)),
            inhibit_dir: PathBuf::from("/run/updraft/inhibit.d"),
            inhibit_group: None,
            logind: true,
            logind_dir: PathBuf::from("/run/systemd/inhibit"),
            inhibit_command: None,
            max_deferral: Some(Dur(Duration::from_secs(24 * 3600))),
            server_may_force: false,
        }
    }
}

/// When a phase of an update may happen, from the loosest to the strictest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Gate {
    /// As soon as it can.
    Auto,
    /// Only inside a maintenance window.
    Window,
    /// Only when an operator runs `updraft apply`.
    Manual,
}

impl Gate {
    pub fn as_str(self) -> &'static str {
        match self {
            Gate::Auto => "auto",
            Gate::Window => "window",
            Gate::Manual => "manual",
        }
    }
}

impl Policy {
    /// What holds the switch: the stricter of `switch` and `reboot`, since
    /// the switch waits for a gated reboot (a power cut must never boot a
    /// trial outside its window), and the key it comes from.
    pub fn switch_gate(&self) -> (Gate, &'static str) {
        if self.reboot > self.switch {
            (self.reboot, "policy.reboot")
        } else {
            (self.switch, "policy.switch")
        }
    }
}

#[derive(Debug, Clone)]
pub struct Device {
    /// This device's hardware id; a release must list it in `compatible`.
    pub compatible: String,
    pub id_file: PathBuf,
    /// The release marker the image build writes into the root filesystem
    /// ([`crate::provision`]).
    pub release_file: PathBuf,
}

fn default_id_file() -> PathBuf {
    PathBuf::from("/data/updraft/device-id")
}

fn default_release_file() -> PathBuf {
    PathBuf::from("/etc/updraft/release")
}

#[derive(Debug, Clone)]
pub struct TrustConfig {
    pub root_keys: Vec<PathBuf>,
    pub keys: Vec<PathBuf>,
    pub threshold: usize,
    /// Version of the key document the provisioned root keys belong to.
    pub keys_version: u64,
}

fn one() -> usize {
    1
}

#[derive(Debug, Clone)]
pub struct Slots {
    pub a: PathBuf,
    pub b: PathBuf,
    pub cmdline: PathBuf,
}

fn default_cmdline() -> PathBuf {
    PathBuf::from("/proc/cmdline")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BootloaderKind {
    Uboot,
    Grub,
    #[default]
    File,
    Script,
    /// The Raspberry Pi firmware's `autoboot.txt` and tryboot flag.
    RpiTryboot,
}

/// Whose boot script reads the bootloader's variables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BootFlow {
    /// updraft's own scripts (`BOOT_ORDER`, `BOOT_A_LEFT`, ...).
    #[default]
    Updraft,
    /// RAUC's, with its bootnames (`bootname_a`, `bootname_b`).
    Rauc,
    /// Mender's (`mender_boot_part`, `upgrade_available`, `bootcount`).
    Mender,
}

#[derive(Debug, Clone)]
pub struct Bootloader {
    pub kind: BootloaderKind,
    /// uboot: whose variables hold the selection.
    pub flow: BootFlow,
    /// uboot with `flow = "rauc"`: RAUC's bootnames of slots A and B.
    pub bootname_a: String,
    pub bootname_b: String,
    pub tries: u32,
    pub path: PathBuf,
    pub fw_env_config: PathBuf,
    /// libubootenv's lock file (uboot backend).
    pub lock_file: PathBuf,
    pub grubenv: PathBuf,
    /// grub with `flow = "mender"`: the directory holding Mender's
    /// `mender_grubenv1/` and `mender_grubenv2/`.
    pub mender_grubenv: PathBuf,
    /// Script backend: an executable called as `SCRIPT <verb> [SLOT] [TRIES]`.
    pub script: Option<PathBuf>,
    /// rpi-tryboot: `autoboot.txt` on the mounted first FAT partition.
    pub autoboot: Option<PathBuf>,
    /// The partition number that names slot A to the bootloader:
    /// rpi-tryboot's boot partition, Mender's `mender_boot_part`.
    pub boot_partition_a: u32,
    /// The same of slot B.
    pub boot_partition_b: u32,
    /// rpi-tryboot: the firmware's `chosen/bootloader` device-tree node.
    pub device_tree: PathBuf,
}

/// The lock libubootenv takes around every access to the U-Boot
/// environment. libubootenv's `src/uboot_env.c` (`default_lockname`,
/// `libuboot_lock`) opens this path with `O_WRONLY | O_CREAT | O_TRUNC`,
/// mode 0666, and holds `flock(fd, LOCK_EX)` on it; the string is the same
/// in the Debian bookworm build (libubootenv 0.3.2). `/var/lock` is
/// `/run/lock`.
pub const DEFAULT_UBOOT_LOCK_FILE: &str = "/var/lock/fw_printenv.lock";

/// Where the Raspberry Pi firmware's `chosen/bootloader` values appear on
/// a running Pi (`partition`, `tryboot`).
pub const DEFAULT_DEVICE_TREE: &str = "/proc/device-tree/chosen/bootloader";

impl Default for Bootloader {
    fn default() -> Self {
        Bootloader {
            kind: BootloaderKind::File,
            flow: BootFlow::Updraft,
            bootname_a: "A".into(),
            bootname_b: "B".into(),
            tries: 3,
            path: PathBuf::from("/data/updraft/boot.state"),
            fw_env_config: PathBuf::from("/etc/fw_env.config"),
            lock_file: PathBuf::from(DEFAULT_UBOOT_LOCK_FILE),
            grubenv: PathBuf::from("/boot/grub/grubenv"),
            mender_grubenv: PathBuf::from("/boot/efi/grub-mender-grubenv"),
            script: None,
            autoboot: None,
            boot_partition_a: 2,
            boot_partition_b: 3,
            device_tree: PathBuf::from(DEFAULT_DEVICE_TREE),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Health {
    pub checks_dir: PathBuf,
    pub required_units: Vec<String>,
    /// Deadline for all checks together.
    pub timeout: Dur,
    /// Deadline for one check executable.
    pub check_timeout: Dur,
    /// Also require that the update server answers.
    pub check_server: bool,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            checks_dir: PathBuf::from("/etc/updraft/health.d"),
            required_units: Vec::new(),
            timeout: Dur(Duration::from_secs(300)),
            check_timeout: Dur(Duration::from_secs(60)),
            check_server: false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RebootMode {
    Auto,
    Manual,
}

#[derive(Debug, Clone)]
pub struct System {
    pub reboot: RebootMode,
    pub reboot_command: Vec<String>,
    pub boot_id_file: PathBuf,
    pub state_dir: PathBuf,
    pub socket: PathBuf,
    /// Group allowed to use read-only socket commands.
    pub socket_group: Option<String>,
    pub metrics_file: Option<PathBuf>,
    /// Data is flushed to the slot every this many bytes.
    pub sync_bytes: u64,
    /// Read the slot back and hash it after writing (always done after a
    /// resumed download).
    pub readback: bool,
    /// How long a reboot the reboot command accepted may take to come
    /// before it is warned about, reported and asked again.
    pub reboot_timeout: Dur,
    /// How long a daemon that could not start waits before it tries again
    /// (doubling up to 15 minutes; `daemon::degraded`).
    pub degraded_retry: Dur,
}

impl Default for System {
    fn default() -> Self {
        System {
            reboot: RebootMode::Auto,
            reboot_command: vec!["systemctl".into(), "reboot".into()],
            boot_id_file: PathBuf::from("/proc/sys/kernel/random/boot_id"),
            state_dir: PathBuf::from("/data/updraft"),
            socket: PathBuf::from("/run/updraft/updraft.sock"),
            socket_group: None,
            metrics_file: None,
            sync_bytes: 32 * 1024 * 1024,
            readback: true,
            reboot_timeout: Dur(Duration::from_secs(600)),
            degraded_retry: Dur(Duration::from_secs(60)),
        }
    }
}

impl Config {
    /// The average rate a download's deadline counts with, and the key it
    /// comes from: `server.download_min_average_rate`, or the lower of
    /// `policy.max_rate` and `policy.window_rate` when that cap is lower
    /// (a capped download cannot go faster).
    pub fn download_rate(&self) -> (u64, &'static str) {
        let floor = self.server.download_min_average_rate.max(1);
        // The lower cap: a download may run inside and outside windows.
        let cap = [
            (self.policy.max_rate, "policy.max_rate"),
            (self.policy.window_rate, "policy.window_rate"),
        ]
        .into_iter()
        .filter_map(|(c, key)| c.map(|c| (c, key)))
        .min_by_key(|(c, _)| *c);
        match cap {
            Some((cap, key)) if cap < floor => (cap, key),
            _ => (floor, "server.download_min_average_rate"),
        }
    }

    /// How long a download of `size` signed bytes may take in all, from
    /// the start of its job: `server.download_allowance` plus `size` over
    /// [`Config::download_rate`], rounded up to the second.
    pub fn download_time(&self, size: u64) -> Duration {
        let (rate, _) = self.download_rate();
        self.server.download_allowance.0 + Duration::from_secs(size.div_ceil(rate))
    }

    /// Read and check the file at `path`.
    pub fn load(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::new(
                Kind::Config,
                format!("reading config {}: {e}", path.display()),
            )
        })?;
        Config::parse(&text).map_err(|e| e.wrap(format!("config {}", path.display())))
    }

    /// The configuration at `path` as far as it parses, without the checks
    /// across keys: what a daemon that cannot start because of them still
    /// needs (its socket, where reports go). `None` when it does not parse.
    pub fn load_unchecked(path: &Path) -> Option<Config> {
        let text = std::fs::read_to_string(path).ok()?;
        let tables = toml_subset::parse(&text).ok()?;
        Config::from_tables(&tables).ok()
    }

    /// Parse and check configuration text. Relative paths are kept as
    /// written (resolved against the working directory when used).
    pub fn parse(text: &str) -> Result<Config> {
        let tables =
            toml_subset::parse(text).map_err(|e| Error::new(Kind::Config, e.to_string()))?;
        let cfg = Config::from_tables(&tables)?;
        cfg.check()?;
        Ok(cfg)
    }

    /// Load the trust anchor: the public key files named by `trust`.
    pub fn trust_anchor(&self) -> Result<Anchor> {
        let t = &self.trust;
        let (paths, key) = if t.root_keys.is_empty() {
            (&t.keys, "trust.keys")
        } else {
            (&t.root_keys, "trust.root_keys")
        };
        let keys = paths
            .iter()
            .map(|p| PublicKey::load(p))
            .collect::<Result<Vec<_>>>()
            .map_err(|e| e.wrap(key))?;
        let set = KeySet::new(keys, t.threshold).map_err(|e| {
            e.wrap(format!("{key} with trust.threshold"))
                .with_kind(Kind::Config)
        })?;
        Ok(if t.root_keys.is_empty() {
            Anchor::Release(set)
        } else {
            Anchor::Root {
                keys: set,
                version: t.keys_version,
            }
        })
    }

    /// The builder keys of `[provenance]`, or `None` when none are
    /// configured (no attestation is required).
    pub fn builder_keys(&self) -> Result<Option<KeySet>> {
        let p = &self.provenance;
        if p.builders.is_empty() {
            return Ok(None);
        }
        let keys = p
            .builders
            .iter()
            .map(|path| PublicKey::load(path))
            .collect::<Result<Vec<_>>>()
            .map_err(|e| e.wrap("provenance.builders"))?;
        KeySet::new(keys, p.threshold).map(Some).map_err(|e| {
            e.wrap("provenance.builders with provenance.threshold")
                .with_kind(Kind::Config)
        })
    }

    pub fn db_path(&self) -> PathBuf {
        self.system.state_dir.join("updraft.db")
    }

    pub fn lock_path(&self) -> PathBuf {
        self.system.state_dir.join("updraft.lock")
    }
}

/// `"4M"`, `"512k"`, `"2Mi"`, `"1000"`: bytes per second. Decimal
/// multipliers (`k` = 1000, `M`, `G`) as network rates are quoted, binary
/// ones (`Ki` = 1024, `Mi`, `Gi`) for those who count in MiB; an optional
/// `B/s` or `/s` after it. Fractions and spaces inside the number are
/// refused.
pub fn parse_rate(text: &str) -> std::result::Result<u64, String> {
    let t = text.trim();
    let t = t
        .strip_suffix("B/s")
        .or_else(|| t.strip_suffix("/s"))
        .unwrap_or(t);
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let mult: u64 = match unit {
        "" => 1,
        "k" | "K" => 1000,
        "M" => 1000 * 1000,
        "G" => 1000 * 1000 * 1000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        _ => {
            return Err(format!(
                "{text:?} is not a rate: a whole number of bytes/s with an optional k, M, G (×1000) or Ki, Mi, Gi (×1024) suffix, e.g. \"4M\""
            ));
        }
    };
    if num.is_empty() {
        return Err(format!("{text:?} is not a rate: no number before {unit:?}"));
    }
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("{text:?} is too large a rate"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
[device]
compatible = "rpi4"
[trust]
keys = ["/k.pub"]
[slots]
a = "/dev/a"
b = "/dev/b"
[system]
reboot_command = ["/sbin/reboot"]
"#;

    #[test]
    fn the_rpi_tryboot_bootloader_needs_its_file_and_two_partitions() {
        let with = |lines: &str| {
            Config::parse(&format!(
                "{MINIMAL}[bootloader]\nkind = \"rpi-tryboot\"\n{lines}"
            ))
        };
        let c = with("autoboot = \"/boot/autoboot/autoboot.txt\"\n").unwrap();
        let b = &c.bootloader;
        assert_eq!(b.kind, BootloaderKind::RpiTryboot);
        assert_eq!((b.boot_partition_a, b.boot_partition_b), (2, 3));
        assert_eq!(b.device_tree, PathBuf::from(DEFAULT_DEVICE_TREE));
        // (lines, the error names)
        let rows = [
            ("", "bootloader.autoboot: is required"),
            (
                "autoboot = \"/a\"\nboot_partition_a = 3\n",
                "bootloader.boot_partition_b: is slot A's partition too (3)",
            ),
            (
                "autoboot = \"/a\"\nboot_partition_a = 0\n",
                "bootloader.boot_partition_a: 0 is not a partition number",
            ),
            (
                "autoboot = \"/a\"\nboot_partition_b = 99999999999\n",
                "99999999999 is too large",
            ),
            (
                "autoboot = \"/a\"\nboot_partition_b = -1\n",
                "boot_partition_b",
            ),
        ];
        for (lines, want) in rows {
            let e = with(lines).unwrap_err().to_string();
            assert!(e.contains(want), "{lines:?}: {e}");
        }
    }

    #[test]
    fn another_updaters_flow_is_for_u_boot_and_rauc_bootnames_need_it() {
        let with = |lines: &str| Config::parse(&format!("{MINIMAL}[bootloader]\n{lines}"));
        let c = with("kind = \"uboot\"\nflow = \"rauc\"\nbootname_a = \"system0\"\nbootname_b = \"system1\"\n").unwrap();
        assert_eq!(c.bootloader.flow, BootFlow::Rauc);
        assert_eq!(c.bootloader.bootname_b, "system1");
        assert!(with("kind = \"grub\"\nflow = \"rauc\"\n").is_ok());
        let c = with("kind = \"uboot\"\nflow = \"mender\"\n").unwrap();
        assert_eq!(c.bootloader.flow, BootFlow::Mender);
        // (lines, the error names)
        let rows = [
            (
                "kind = \"file\"\nflow = \"mender\"\n",
                "bootloader.flow: Mender's variables are kept with kind = \"uboot\" or \"grub\"",
            ),
            (
                "kind = \"file\"\nflow = \"rauc\"\n",
                "bootloader.flow: RAUC's variables are kept with kind = \"uboot\" or \"grub\"",
            ),
            ("kind = \"uboot\"\nflow = \"systemd\"\n", "flow"),
            (
                "kind = \"uboot\"\nbootname_a = \"system0\"\n",
                "bootloader.bootname_a: bootnames are RAUC's",
            ),
            (
                "kind = \"uboot\"\nflow = \"rauc\"\nbootname_a = \"a b\"\n",
                "\"a b\" is not a bootname",
            ),
            (
                "kind = \"uboot\"\nflow = \"rauc\"\nbootname_a = \"B\"\n",
                "bootloader.bootname_b: is slot A's bootname too (B)",
            ),
            (
                "kind = \"uboot\"\nflow = \"mender\"\nboot_partition_b = 2\n",
                "is slot A's partition too (2)",
            ),
        ];
        for (lines, want) in rows {
            let e = with(lines).unwrap_err().to_string();
            assert!(e.contains(want), "{lines:?}: {e}");
        }
    }

    #[test]
    fn the_file_bootloader_asks_for_a_reboot_command() {
        let without = MINIMAL.replace("reboot_command = [\"/sbin/reboot\"]\n", "");
        let e = Config::parse(&without).unwrap_err().to_string();
        assert!(
            e.contains("system.reboot_command") && e.contains("bootloader.kind = \"file\""),
            "{e}"
        );
        let manual = without.replace("[system]\n", "[system]\nreboot = \"manual\"\n");
        assert!(
            Config::parse(&manual)
                .unwrap()
                .system
                .reboot_command
                .is_empty()
        );
        // Every other bootloader keeps the system's reboot.
        let grub = format!("{without}[bootloader]\nkind = \"grub\"\n");
        assert_eq!(
            Config::parse(&grub).unwrap().system.reboot_command,
            ["systemctl", "reboot"]
        );
    }

    #[test]
    fn minimal_config_takes_defaults() {
        let c = Config::parse(MINIMAL).unwrap();
        assert_eq!(c.server.poll_interval.0, Duration::from_secs(1800));
        assert_eq!(c.bootloader.kind, BootloaderKind::File);
        assert_eq!(c.system.state_dir, PathBuf::from("/data/updraft"));
        assert_eq!(c.server.jitter(), Duration::from_secs(450));
    }

    #[test]
    fn a_ddi_server_takes_its_keys_and_a_token_on_the_data_partition() {
        let c = Config::parse(&format!(
            "[server]\nkind = \"hawkbit\"\nddi_url = \"https://ddi.example:8443/\"\ntenant = \"acme\"\n\
             {}",
            MINIMAL.replace("[system]\n", "[system]\nstate_dir = \"/data/updraft\"\n")
        ))
        .unwrap();
        let s = &c.server;
        assert_eq!(s.kind, ServerKind::Hawkbit);
        assert_eq!((s.tenant.as_str(), s.controller_id.as_str()), ("acme", ""));
        assert_eq!(s.ddi_auth, DdiAuth::TargetToken);
        assert_eq!(
            s.token_file.as_deref(),
            Some(Path::new("/data/updraft/ddi-token"))
        );
        assert_eq!(s.clamp_sleep(Duration::from_secs(1)), crate::ddi::MIN_SLEEP);
        assert_eq!(
            s.clamp_sleep(Duration::from_secs(7 * 24 * 3600)),
            crate::ddi::MAX_SLEEP
        );
        let c = Config::parse(&format!(
            "[server]\nkind = \"hawkbit\"\nddi_url = \"https://ddi.example\"\nddi_auth = \"none\"\n{MINIMAL}"
        ))
        .unwrap();
        assert_eq!(c.server.token_file, None);
        assert_eq!(c.server.ddi_auth.scheme(), None);
    }

    #[test]
    fn a_ddi_server_refuses_static_keys_and_bad_paths() {
        let refused = |server: &str| {
            Config::parse(&format!("[server]\n{server}\n{MINIMAL}"))
                .unwrap_err()
                .to_string()
        };
        let ddi = "kind = \"hawkbit\"\nddi_url = \"https://ddi.example\"";
        for (extra, want) in [
            (
                "manifest_url = \"https://x/m.json\"",
                "server.manifest_url: is for kind = \"static\"",
            ),
            (
                "report_url = \"https://x/r\"",
                "server.report_url: is for kind = \"static\"",
            ),
            ("tenant = \"../x\"", "server.tenant: \"../x\" must be"),
            (
                "controller_id = \"a b\"",
                "server.controller_id: \"a b\" must be",
            ),
            (
                "ddi_auth = \"none\"\ntoken_file = \"/t\"",
                "server.token_file: is set but",
            ),
            (
                "ddi_sleep_min = \"2h\"\nddi_sleep_max = \"1h\"",
                "server.ddi_sleep_min",
            ),
            ("ddi_auth = \"password\"", "ddi_auth"),
        ] {
            let e = refused(&format!("{ddi}\n{extra}"));
            assert!(e.contains(want), "{extra}: {want:?} not in {e:?}");
        }
        for (server, want) in [
            ("kind = \"hawkbit\"", "server.ddi_url: is required"),
            ("kind = \"hawkbit\"\nddi_url = \"http://h\"", "plain http"),
            (
                "kind = \"hawkbit\"\nddi_url = \"https://u:p@h\"",
                "without credentials",
            ),
            (
                "kind = \"hawkbit\"\nddi_url = \"https://h/?t=1\"",
                "without credentials, query",
            ),
            (
                "ddi_url = \"https://h\"",
                "server.ddi_url: is for a DDI server",
            ),
        ] {
            let e = refused(server);
            assert!(e.contains(want), "{server}: {want:?} not in {e:?}");
        }
    }

    #[test]
    fn unknown_key_is_named() {
        let e = Config::parse(&MINIMAL.replace("[system]\n", "[system]\nstate_dri = \"/x\"\n"))
            .unwrap_err();
        assert!(e.to_string().contains("state_dri"), "{e}");
        assert_eq!(e.kind(), Kind::Config);
    }

    #[test]
    fn bad_duration_is_named() {
        let e =
            Config::parse(&format!("[server]\npoll_interval = \"soon\"\n{MINIMAL}")).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("poll_interval") && msg.contains("\"soon\""),
            "{msg}"
        );
    }

    #[test]
    fn the_download_deadline_grows_with_the_signed_size() {
        let c = Config::parse(MINIMAL).unwrap();
        // One hour, plus the size at 4 KiB/s on average.
        assert_eq!(c.download_time(0), Duration::from_secs(3600));
        assert_eq!(
            c.download_time(1 << 30),
            Duration::from_secs(3600 + (1 << 30) / 4096)
        );
        let c = Config::parse(&format!(
            "[server]\ndownload_allowance = \"2s\"\ndownload_min_average_rate = 1000\n{MINIMAL}"
        ))
        .unwrap();
        // Rounded up to the second.
        assert_eq!(c.download_time(1001), Duration::from_secs(4));
    }

    #[test]
    fn rates_take_decimal_and_binary_multipliers() {
        assert_eq!(parse_rate("1000"), Ok(1000));
        assert_eq!(parse_rate("512k"), Ok(512_000));
        assert_eq!(parse_rate("4M"), Ok(4_000_000));
        assert_eq!(parse_rate("4Mi"), Ok(4 << 20));
        assert_eq!(parse_rate("2MiB/s"), Ok(2 << 20));
        assert_eq!(parse_rate("1G/s"), Ok(1_000_000_000));
        for bad in [
            "",
            "M",
            "4 M",
            "4.5M",
            "4m",
            "-4M",
            "4MB",
            "99999999999999999999G",
        ] {
            assert!(parse_rate(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn a_bad_rate_cap_is_refused_with_its_key_and_line() {
        for (value, why) in [
            ("\"fast\"", "is not a rate"),
            ("0", "would stop every download"),
            ("true", "expected bytes per second"),
            ("\"100\"", "below server.min_rate (256 bytes/s)"),
        ] {
            let e = Config::parse(&format!("{MINIMAL}\n[policy]\nmax_rate = {value}\n"))
                .unwrap_err()
                .to_string();
            assert!(e.starts_with("policy.max_rate"), "{value}: {e}");
            assert!(e.contains(why), "{value}: {e}");
            if why != "below server.min_rate (256 bytes/s)" {
                assert!(e.contains("(line "), "{value}: {e}");
            }
        }
    }

    #[test]
    fn a_gated_reboot_holds_the_switch_too() {
        let c = Config::parse(&format!(
            "{MINIMAL}\n[policy]\nreboot = \"window\"\nwindows = [\"Mon-Fri 02:00/3h\", \"Sat,Sun 00:00/8h UTC\"]\n"
        ))
        .unwrap();
        assert_eq!(c.policy.switch, Gate::Auto);
        assert_eq!(c.policy.switch_gate(), (Gate::Window, "policy.reboot"));
        assert_eq!(c.policy.windows.0.len(), 2);
        let c = Config::parse(&format!(
            "{MINIMAL}\n[policy]\nswitch = \"manual\"\nreboot = \"window\"\nwindows = [\"Mon 02:00/1h\"]\n"
        ))
        .unwrap();
        assert_eq!(c.policy.switch_gate(), (Gate::Manual, "policy.switch"));
        let c = Config::parse(MINIMAL).unwrap();
        assert_eq!(c.policy.switch_gate(), (Gate::Auto, "policy.switch"));
    }

    #[test]
    fn malformed_windows_are_refused_with_the_key_and_line() {
        let e = Config::parse(&format!(
            "{MINIMAL}\n[policy]\nswitch = \"window\"\nwindows = [\"Mon 02:00/3h\", \"Mon-Frii 02:00/3h\"]\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("policy.windows (line "), "{e}");
        assert!(
            e.contains("\"Mon-Frii 02:00/3h\": \"Frii\" is not a day"),
            "{e}"
        );
        let e = Config::parse(&format!("{MINIMAL}\n[policy]\nreboot = \"window\"\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("policy.reboot: \"window\" needs at least one window in policy.windows"),
            "{e}"
        );
        let e = Config::parse(&format!("{MINIMAL}\n[policy]\nswitch = \"later\"\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"later\" is not one of \"auto\", \"window\", \"manual\""),
            "{e}"
        );
    }

    #[test]
    fn inhibitor_keys_take_defaults_and_values() {
        let c = Config::parse(MINIMAL).unwrap();
        let p = &c.policy;
        assert_eq!(p.inhibit_dir, PathBuf::from("/run/updraft/inhibit.d"));
        assert_eq!(p.inhibit_group, None);
        assert!(p.logind);
        assert_eq!(p.logind_dir, PathBuf::from("/run/systemd/inhibit"));
        assert_eq!(p.inhibit_command, None);
        assert_eq!(p.max_deferral, Some(Dur(Duration::from_secs(24 * 3600))));
        let c = Config::parse(&format!(
            "{MINIMAL}\n[policy]\ninhibit_dir = \"/x\"\ninhibit_group = \"wheel\"\n\
             inhibit_command = [\"/bin/check\", \"--quiet\"]\nlogind = false\n\
             logind_dir = \"/y\"\nmax_deferral = \"2h\"\n"
        ))
        .unwrap();
        let p = &c.policy;
        assert_eq!(p.inhibit_dir, PathBuf::from("/x"));
        // Parsing never looks the group up: it need not exist here.
        assert_eq!(p.inhibit_group.as_deref(), Some("wheel"));
        assert_eq!(
            p.inhibit_command,
            Some(vec!["/bin/check".to_string(), "--quiet".to_string()])
        );
        assert!(!p.logind);
        assert_eq!(p.logind_dir, PathBuf::from("/y"));
        assert_eq!(p.max_deferral, Some(Dur(Duration::from_secs(7200))));
    }

    #[test]
    fn a_zero_max_deferral_means_no_limit() {
        for zero in ["\"0\"", "\"0s\"", "\" 0 \"", "\"0m\""] {
            let c = Config::parse(&format!("{MINIMAL}\n[policy]\nmax_deferral = {zero}\n"))
                .unwrap_or_else(|e| panic!("{zero}: {e}"));
            assert_eq!(c.policy.max_deferral, None, "{zero}");
        }
        for (bad, why) in [
            ("0", "expected a duration in quotes"),
            ("\"2\"", "is not a duration"),
            ("\"-1h\"", "is not a duration"),
            ("\"soon\"", "is not a duration"),
        ] {
            let e = Config::parse(&format!("{MINIMAL}\n[policy]\nmax_deferral = {bad}\n"))
                .unwrap_err()
                .to_string();
            assert!(e.starts_with("policy.max_deferral (line "), "{bad}: {e}");
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn an_empty_inhibit_command_is_refused_with_the_key_and_line() {
        for (value, why) in [
            ("[]", "is empty"),
            ("[\"\", \"x\"]", "names no program"),
            ("\"/bin/check\"", "expected an array of strings"),
            ("[\"/bin/check\", 1]", "expected an array of strings"),
        ] {
            let e = Config::parse(&format!("{MINIMAL}\n[policy]\ninhibit_command = {value}\n"))
                .unwrap_err();
            assert_eq!(e.kind(), Kind::Config);
            let e = e.to_string();
            assert!(
                e.starts_with("policy.inhibit_command (line "),
                "{value}: {e}"
            );
            assert!(e.contains(why), "{value}: {e}");
        }
        let e = Config::parse(&format!("{MINIMAL}\n[policy]\nlogind = \"yes\"\n"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("policy.logind (line "), "{e}");
    }

    #[test]
    fn a_cap_below_the_average_rate_stretches_the_download_deadline() {
        let c = Config::parse(&format!(
            "[server]\ndownload_allowance = \"2s\"\ndownload_min_average_rate = 1000\n{MINIMAL}\n[policy]\nmax_rate = 500\n"
        ))
        .unwrap();
        assert_eq!(c.download_rate(), (500, "policy.max_rate"));
        assert_eq!(c.download_time(1000), Duration::from_secs(4));
        let c = Config::parse(&format!("{MINIMAL}\n[policy]\nmax_rate = \"4Mi\"\n")).unwrap();
        assert_eq!(c.policy.max_rate, Some(4 << 20));
        assert_eq!(
            c.download_rate(),
            (4096, "server.download_min_average_rate")
        );
    }

    #[test]
    fn a_window_rate_needs_windows_and_the_floor_and_counts_for_the_deadline() {
        let c = Config::parse(&format!(
            "[server]\ndownload_allowance = \"2s\"\ndownload_min_average_rate = 1000\n{MINIMAL}\n[policy]\nmax_rate = 800\nwindow_rate = \"4Mi\"\nwindows = [\"Mon 02:00/1h\"]\n"
        ))
        .unwrap();
        assert_eq!(c.policy.window_rate, Some(4 << 20));
        assert_eq!(c.download_rate(), (800, "policy.max_rate"));
        let c = Config::parse(&format!(
            "[server]\ndownload_min_average_rate = 1000\n{MINIMAL}\n[policy]\nwindow_rate = 600\nwindows = [\"Mon 02:00/1h\"]\n"
        ))
        .unwrap();
        assert_eq!(c.download_rate(), (600, "policy.window_rate"));
        let e = Config::parse(&format!("{MINIMAL}\n[policy]\nwindow_rate = \"1M\"\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("policy.window_rate: needs at least one window"),
            "{e}"
        );
        let e = Config::parse(&format!(
            "[server]\nmin_rate = 20000\n{MINIMAL}\n[policy]\nwindow_rate = \"10k\"\nwindows = [\"Mon 02:00/1h\"]\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("policy.window_rate: 10000 bytes/s is below server.min_rate"),
            "{e}"
        );
    }

    #[test]
    fn a_download_deadline_that_cannot_be_met_is_refused() {
        let e = Config::parse(&format!(
            "[server]\ndownload_min_average_rate = 0\n{MINIMAL}"
        ))
        .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("server.download_min_average_rate: must be at least 1"),
            "{e}"
        );
        let e = Config::parse(&format!("[server]\ndownload_allowance = \"0s\"\n{MINIMAL}"))
            .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("server.download_allowance: must be at least 1s"),
            "{e}"
        );
    }

    #[test]
    fn plain_http_needs_the_development_switch() {
        let cfg = format!("[server]\nmanifest_url = \"http://127.0.0.1/m.json\"\n{MINIMAL}");
        let e = Config::parse(&cfg).unwrap_err();
        assert!(e.to_string().starts_with("server.manifest_url:"), "{e}");
        let cfg = format!(
            "[server]\nmanifest_url = \"http://127.0.0.1/m.json\"\ninsecure_allow_http = true\n{MINIMAL}"
        );
        assert!(Config::parse(&cfg).is_ok());
    }

    #[test]
    fn trust_modes_are_exclusive() {
        let cfg = MINIMAL.replace(
            "keys = [\"/k.pub\"]",
            "keys = [\"/k.pub\"]\nroot_keys = [\"/r.pub\"]",
        );
        assert!(
            Config::parse(&cfg)
                .unwrap_err()
                .to_string()
                .contains("exclusive")
        );
    }

    #[test]
    fn same_slot_twice_is_refused() {
        let cfg = MINIMAL.replace("b = \"/dev/b\"", "b = \"/dev/a\"");
        assert!(
            Config::parse(&cfg)
                .unwrap_err()
                .to_string()
                .starts_with("slots.b")
        );
    }

    #[test]
    fn a_boot_component_names_two_directories_that_never_overlap() {
        let with =
            |table: &str| Config::parse(&format!("{MINIMAL}\n[components.firmware]\n{table}"));
        let c = with("kind = \"boot\"\na = \"/boot/slot-a\"\nb = \"/boot/slot-b\"\n").unwrap();
        let boot = c.component("firmware").unwrap();
        assert_eq!(
            boot.slot_dir(crate::slot::SlotName::B),
            Some(Path::new("/boot/slot-b"))
        );
        for (table, needle) in [
            ("kind = \"boot\"\n", "needs a and b"),
            ("kind = \"boot\"\na = \"/boot/a\"\n", "a and b go together"),
            (
                "kind = \"boot\"\na = \"/boot\"\nb = \"/boot/b\"\n",
                "overlap",
            ),
            (
                "kind = \"boot\"\na = \"/\"\nb = \"/boot/b\"\n",
                "other than /",
            ),
            (
                "kind = \"boot\"\na = \"boot/a\"\nb = \"/boot/b\"\n",
                "absolute",
            ),
            (
                "kind = \"boot\"\na = \"/boot/a\"\nb = \"/boot/b\"\nunits = [\"x.service\"]\n",
                "tried with their slot",
            ),
            (
                "kind = \"app\"\na = \"/boot/a\"\nb = \"/boot/b\"\n",
                "a boot component's",
            ),
        ] {
            let e = with(table).unwrap_err().to_string();
            assert!(
                e.contains(needle) && e.contains("components.firmware"),
                "{table}: {e}"
            );
        }
    }

    #[test]
    fn a_direct_tcti_names_a_device_or_a_software_tpms_socket() {
        use TpmTransport::{Device, Tcp, Unix};
        let ok = [
            ("device:/dev/tpmrm0", Device("/dev/tpmrm0".into())),
            ("swtpm:", Tcp("localhost".into(), 2321)),
            (
                "swtpm:host=127.0.0.1,port=40000",
                Tcp("127.0.0.1".into(), 40000),
            ),
            ("swtpm:port=2400", Tcp("localhost".into(), 2400)),
            ("swtpm:path=/run/swtpm.sock", Unix("/run/swtpm.sock".into())),
        ];
        for (tcti, want) in ok {
            assert_eq!(tpm_transport(tcti), Ok(want), "{tcti}");
        }
        let bad = [
            ("device:", "names no absolute device path"),
            ("device:tpmrm0", "names no absolute device path"),
            ("tabrmd:", "only device:PATH"),
            ("mssim:port=2321", "only device:PATH"),
            ("swtpm:port=0", "has port \"0\", not a port number"),
            ("swtpm:port=70000", "not a port number"),
            ("swtpm:path=rel.sock", "swtpm takes host=, port= or path=/"),
            ("swtpm:user=x", "has \"user=x\""),
        ];
        for (tcti, want) in bad {
            let e = tpm_transport(tcti).unwrap_err();
            assert!(e.contains(want) && e.contains(tcti), "{tcti}: {e}");
        }
    }

    #[test]
    fn the_rollback_counter_is_configured_with_its_own_keys_only() {
        let with = |lines: &str| Config::parse(&format!("{MINIMAL}[rollback]\n{lines}"));
        let none = Config::parse(MINIMAL).unwrap().rollback;
        assert_eq!(none, Rollback::default());
        assert_eq!(none.counter, CounterKind::None);
        assert_eq!(none.on_unreadable, OnUnreadable::Refuse);
        let tpm = with("counter = \"tpm2\"\n").unwrap().rollback;
        assert_eq!(tpm.counter, CounterKind::Tpm2);
        assert_eq!(tpm.nv_index, Some(0x0150_0016));
        assert_eq!(tpm.tcti, "device:/dev/tpmrm0");
        assert_eq!(
            tpm.access,
            TpmAccess::Tools,
            "what a [rollback] meant before access"
        );
        let direct = with("counter = \"tpm2\"\naccess = \"direct\"\n")
            .unwrap()
            .rollback;
        assert_eq!(direct.access, TpmAccess::Direct);
        assert_eq!(
            tpm_transport(&direct.tcti),
            Ok(TpmTransport::Device("/dev/tpmrm0".into()))
        );
        let tpm = with("counter = \"tpm2\"\nnv_index = \"0x1500020\"\ntcti = \"swtpm:host=127.0.0.1,port=2321\"\non_unreadable = \"allow\"\n")
            .unwrap()
            .rollback;
        assert_eq!(tpm.nv_index, Some(0x0150_0020));
        assert_eq!(tpm.tcti, "swtpm:host=127.0.0.1,port=2321");
        assert_eq!(tpm.on_unreadable, OnUnreadable::Allow);
        assert_eq!(
            with("counter = \"tpm2\"\nnv_index = 22020118\n")
                .unwrap()
                .rollback
                .nv_index,
            Some(0x0150_0016)
        );
        let cmd = with("counter = \"command\"\nread_command = [\"/usr/sbin/rpmb-counter\", \"read\"]\nadvance_command = [\"/usr/sbin/rpmb-counter\", \"advance\"]\n")
            .unwrap()
            .rollback;
        assert_eq!(cmd.read_command, ["/usr/sbin/rpmb-counter", "read"]);
        assert_eq!(cmd.advance_command, ["/usr/sbin/rpmb-counter", "advance"]);
        // (lines, what the error names)
        let rows = [
            (
                "counter = \"rpmb\"\n",
                "\"rpmb\" is not one of \"none\", \"tpm2\", \"command\"",
            ),
            (
                "counter = \"tpm2\"\nnv_index = \"0x81000001\"\n",
                "is not an NV index",
            ),
            (
                "counter = \"tpm2\"\nnv_index = \"1500016\"\n",
                "is not an NV index",
            ),
            ("counter = \"tpm2\"\nnv_index = -1\n", "is not an NV index"),
            (
                "counter = \"tpm2\"\ntcti = \" \"\n",
                "rollback.tcti is empty",
            ),
            (
                "counter = \"tpm2\"\naccess = \"tss\"\n",
                "\"tss\" is not one of \"tools\", \"direct\"",
            ),
            (
                "counter = \"tpm2\"\naccess = \"direct\"\ntcti = \"tabrmd:\"\n",
                "rollback.tcti \"tabrmd:\" cannot be used with rollback.access = \"direct\"",
            ),
            (
                "counter = \"command\"\naccess = \"direct\"\n",
                "rollback.access is only used with counter = \"tpm2\"",
            ),
            (
                "counter = \"tpm2\"\nread_command = [\"x\"]\n",
                "rollback.read_command is only used with counter = \"command\"",
            ),
            (
                "nv_index = \"0x1500016\"\n",
                "rollback.nv_index is only used with counter = \"tpm2\"",
            ),
            (
                "counter = \"command\"\ntcti = \"device\"\n",
                "rollback.tcti is only used with counter = \"tpm2\"",
            ),
            (
                "counter = \"command\"\nread_command = [\"r\"]\n",
                "rollback.advance_command is required",
            ),
            (
                "counter = \"command\"\nread_command = []\nadvance_command = [\"a\"]\n",
                "rollback.read_command is required",
            ),
            (
                "counter = \"command\"\nread_command = [\"\"]\nadvance_command = [\"a\"]\n",
                "rollback.read_command is required",
            ),
            (
                "on_unreadable = \"ignore\"\n",
                "\"ignore\" is not one of \"refuse\", \"allow\"",
            ),
            (
                "counter = \"none\"\nfloor = 3\n",
                "unknown key rollback.floor",
            ),
        ];
        for (lines, want) in rows {
            let e = with(lines).unwrap_err().to_string();
            assert!(e.contains(want), "{lines:?}: {e}");
        }
    }

    #[test]
    fn provenance_names_builder_keys_and_a_threshold() {
        let with = |lines: &str| Config::parse(&format!("{MINIMAL}[provenance]\n{lines}"));
        let none = Config::parse(MINIMAL).unwrap();
        assert!(none.provenance.builders.is_empty());
        assert!(none.builder_keys().unwrap().is_none());
        let p = with("builders = [\"/etc/updraft/builder.pub\"]\n")
            .unwrap()
            .provenance;
        assert_eq!(p.builders, vec![PathBuf::from("/etc/updraft/builder.pub")]);
        assert_eq!(p.threshold, 1);
        let cfg = with("builders = [\"/nonexistent/builder.pub\"]\nthreshold = 1\n").unwrap();
        let e = cfg.builder_keys().unwrap_err();
        assert_eq!(e.kind(), Kind::Config);
        assert!(
            e.message()
                .starts_with("provenance.builders: reading public key /nonexistent/builder.pub"),
            "{e}"
        );
        let e = with("builder = [\"/b.pub\"]\n").unwrap_err().to_string();
        assert!(e.contains("builder"), "{e}");
    }
}
