//! A hawkBit DDI conformance server: the Direct Device Integration API of
//! Eclipse hawkBit, answered the way hawkBit's own code answers it, for
//! the end-to-end tests of updraft's DDI client mode where gooseBit falls
//! short (feedback checked field by field, `410` on closed actions, the
//! status quota, cancellation, download-only actions, throttling, range
//! requests and cut downloads, credentials per origin).
//!
//! # What it emulates
//!
//! One tenant, on three loopback listeners (each a different origin):
//!
//! * [`Origin::Ddi`], HTTPS with a certificate from a [`TestCa`]: the DDI
//!   API under `/{tenant}/controller/v1/{controllerId}` (the controller
//!   base, `deploymentBase`, its feedback, `cancelAction`, its feedback,
//!   `installedBase`, `configData`) and the artifact downloads under
//!   `…/softwaremodules/{id}/artifacts/{file}` (and `.MD5SUM`);
//! * [`Origin::Http`], plain HTTP, the same resources, where the
//!   `download-http` and `md5sum-http` links point (a client must never
//!   use them: every request it gets is recorded);
//! * [`Origin::Cdn`], HTTPS, a download server of another origin
//!   (`/api/v1/{tenant}/download/controller/{id}/softwaremodules/{id}/filename/{file}`,
//!   the shape of hawkBit's documented example links), where the
//!   `download` links of artifacts made with [`Artifact::from_cdn`] point.
//!   It asks for no credentials; the test asserts the client sent none.
//!
//! Artifacts carry the four links of hawkBit's documented example
//! ([`Links::Documented`]), or only what a hawkBit with its default
//! configuration writes ([`Links::HawkbitDefaults`]: `download-http` and
//! `md5sum-http` at the request's own scheme, so `https` links named
//! `download-http` and no `download` link).
//!
//! Tests script it through a typed API: controllers and their target
//! tokens ([`DdiServer::add_controller`]), deployments
//! ([`DdiServer::deploy`] with a [`Deployment`] of [`Chunk`]s of
//! [`Artifact`]s made from local files, hashes computed from them),
//! cancellation ([`DdiServer::cancel`]), the polling sleep, the quotas,
//! throttling ([`DdiServer::throttle`]: `429` for the next requests) and a
//! cut download ([`DdiServer::cut_once`]). They observe every request
//! ([`DdiServer::requests`]: method, target, `Authorization`, `Range`,
//! origin, status), every feedback body with the schema violations found
//! in it ([`DdiServer::feedback`], [`DdiServer::feedback_log`],
//! [`DdiServer::violations`]), each action's state and status history as
//! hawkBit keeps it ([`DdiServer::action`]), the attributes stored from
//! `configData` and the bytes served per file.
//!
//! The rules, each cited where it is implemented, are those of hawkBit's
//! source at commit `67ca1c43321e6b5ed091b667bf36d27dab0cf3eb` of
//! `eclipse-hawkbit/hawkbit` ([`HAWKBIT_COMMIT`]); paths below are in that
//! tree:
//!
//! | name in comments | file |
//! |---|---|
//! | `DdiRootController` | `hawkbit-ddi/hawkbit-ddi-resource/src/main/java/org/eclipse/hawkbit/ddi/rest/resource/DdiRootController.java` |
//! | `DataConversionHelper` | `hawkbit-ddi/hawkbit-ddi-resource/src/main/java/org/eclipse/hawkbit/ddi/rest/resource/DataConversionHelper.java` |
//! | `DdiRootControllerRestApi` | `hawkbit-ddi/hawkbit-ddi-api/src/main/java/org/eclipse/hawkbit/ddi/rest/api/DdiRootControllerRestApi.java` |
//! | `Ddi*.java` models | `hawkbit-ddi/hawkbit-ddi-api/src/main/java/org/eclipse/hawkbit/ddi/json/model/` |
//! | `JpaControllerManagement` | `hawkbit-repository/hawkbit-repository-jpa/src/main/java/org/eclipse/hawkbit/repository/jpa/management/JpaControllerManagement.java` |
//! | `JpaActionManagement` | `hawkbit-repository/hawkbit-repository-jpa/src/main/java/org/eclipse/hawkbit/repository/jpa/management/JpaActionManagement.java` |
//! | `JpaActionStatus` | `hawkbit-repository/hawkbit-repository-jpa/src/main/java/org/eclipse/hawkbit/repository/jpa/model/JpaActionStatus.java` |
//! | `DeploymentHelper` | `hawkbit-repository/hawkbit-repository-jpa/src/main/java/org/eclipse/hawkbit/repository/jpa/utils/DeploymentHelper.java` |
//! | `RepositoryConstants`, `Target.java`, `Action.java` | `hawkbit-repository/hawkbit-repository-api/src/main/java/org/eclipse/hawkbit/repository/` (and `model/`) |
//! | `QuotaHelper` | `hawkbit-repository/hawkbit-repository-jpa/src/main/java/org/eclipse/hawkbit/repository/jpa/utils/QuotaHelper.java` |
//! | `HawkbitSecurityProperties` | `hawkbit-core/src/main/java/org/eclipse/hawkbit/security/HawkbitSecurityProperties.java` |
//! | `RestConfiguration` | `hawkbit-rest/hawkbit-rest-core/src/main/java/org/eclipse/hawkbit/rest/RestConfiguration.java` |
//! | `DosFilter` | `hawkbit-rest/hawkbit-rest-core/src/main/java/org/eclipse/hawkbit/rest/security/DosFilter.java` |
//! | `FileStreamingUtil` | `hawkbit-rest/hawkbit-rest-core/src/main/java/org/eclipse/hawkbit/rest/util/FileStreamingUtil.java` |
//! | `ControllerSecurityConfiguration` | `hawkbit-ddi/hawkbit-ddi-starter/src/main/java/org/eclipse/hawkbit/autoconfigure/ddi/ControllerSecurityConfiguration.java` |
//! | `ControllerDownloadSecurityConfiguration` | same directory |
//! | `SecurityTokenAuthenticator`, `GatewayTokenAuthenticator` | `hawkbit-ddi/hawkbit-ddi-security/src/main/java/org/eclipse/hawkbit/security/controller/` |
//! | `hawkbit-jackson-defaults.properties` | `hawkbit-core/src/main/resources/` |
//! | `hawkbit-artifactdl-defaults.properties` | `hawkbit-autoconfigure/src/main/resources/` |
//! | `ControllerPollProperties` | `hawkbit-repository/hawkbit-repository-api/src/main/java/org/eclipse/hawkbit/tenancy/configuration/ControllerPollProperties.java` |
//! | `ddi.html` | `docs/rest-api/ddi.html` (the published OpenAPI document) |
//! | `direct-device-integration-api.md` | `docs/direct-device-integration-api.md` |
//!
//! One rule comes from the framework under hawkBit: the ETag of the JSON
//! resources is Spring's `ShallowEtagHeaderFilter` (`"0"` and the body's
//! MD5), which `RestConfiguration` installs.
//!
//! The documented example bodies it answers in the shape of are in
//! `tests/fixtures/ddi/` ([`fixture`]), each with its source noted there.
//!
//! # What it never does
//!
//! It never listens anywhere but loopback, never connects anywhere, never
//! reads a file it was not given as an artifact, and never decides what a
//! test asserts. It does not emulate: CBOR bodies (`415`), confirmation
//! (`confirmationBase`: `404`), the artifact list of a software module,
//! action weights (the oldest open action is the one shown), polling
//! intervals computed from maintenance schedules, the expiry of a
//! maintenance schedule, client certificates (the `None` [`Auth`] stands
//! for a reverse proxy that authenticated the device), the multi-part
//! answer to several ranges (answered with the whole file) and `If-Range`
//! dates (only an `If-Range` equal to the ETag keeps the range). Error
//! bodies other than hawkBit's `ExceptionInfo` are empty.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use md5::Digest;
use rustls::{ServerConfig, ServerConnection, StreamOwned};
use serde_json::Value;

use crate::ca::TestCa;
use crate::http::{
    Acceptor, Body, HttpConn, Range, Request, Response, Transport, bind_loopback, http_date,
    parse_head, parse_range, path_of, percent_decode, percent_encode, query_of, tls_server_config,
};

/// The hawkBit commit whose source every rule here is taken from.
pub const HAWKBIT_COMMIT: &str = "67ca1c43321e6b5ed091b667bf36d27dab0cf3eb";

/// `maxStatusEntriesPerAction` by default (`HawkbitSecurityProperties.Dos`).
pub const DEFAULT_STATUS_QUOTA: usize = 1000;
/// `maxMessagesPerActionStatus` by default (`HawkbitSecurityProperties.Dos`).
pub const DEFAULT_MESSAGE_QUOTA: usize = 50;
/// `maxAttributeEntriesPerTarget` by default (`HawkbitSecurityProperties.Dos`).
pub const DEFAULT_ATTRIBUTE_QUOTA: usize = 100;
/// `hawkbit.controller.pollingTime` by default (`ControllerPollProperties`).
pub const DEFAULT_SLEEP: &str = "00:05:00";
/// `Target.CONTROLLER_ATTRIBUTE_MAX_KEY_SIZE` and `…_MAX_VALUE_SIZE`
/// (`hawkbit-repository-api/…/repository/model/Target.java`), in UTF-16
/// code units as Java's `String.length()` counts.
pub const MAX_ATTRIBUTE: usize = 128;
/// `JpaActionStatus.MESSAGE_ENTRY_LENGTH`: a longer message is stored as
/// several entries of at most this many UTF-16 code units, each counting
/// against the message quota.
pub const MESSAGE_ENTRY_LENGTH: usize = 512;
/// `RepositoryConstants.SERVER_MESSAGE_PREFIX`: what the server's own
/// status messages start with.
pub const SERVER_MESSAGE_PREFIX: &str = "Update Server: ";
/// `RepositoryConstants.MAX_ACTION_HISTORY_MSG_COUNT`.
pub const MAX_ACTION_HISTORY: usize = 100;

/// The largest request body read (feedback and configData are small).
const MAX_BODY: u64 = 1024 * 1024;

/// A documented example body from `tests/fixtures/ddi/` (`name` without
/// `.json`), parsed.
///
/// # Panics
/// When the fixture is missing or not JSON: the test tree is broken.
pub fn fixture(name: &str) -> Value {
    let path = fixtures_dir().join(format!("{name}.json"));
    let text = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("reading the DDI fixture {}: {e}", path.display()));
    serde_json::from_slice(&text)
        .unwrap_or_else(|e| panic!("the DDI fixture {} is not JSON: {e}", path.display()))
}

/// `tests/fixtures/ddi/`.
pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/ddi")
}

/// Whether `ours` has the fields and shape of `documented`: the same keys
/// in every object (both ways), the same JSON type at every leaf, and
/// every element of an array shaped as the documented array's element at
/// the same index (or its first one). Returns the differences, one per
/// line, naming the path.
pub fn shape_differences(documented: &Value, ours: &Value) -> Vec<String> {
    let mut out = Vec::new();
    shape_diff("$", documented, ours, &mut out);
    out
}

fn shape_diff(at: &str, doc: &Value, ours: &Value, out: &mut Vec<String>) {
    let kind = |v: &Value| match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    match (doc, ours) {
        (Value::Object(d), Value::Object(o)) => {
            for k in d.keys().filter(|k| !o.contains_key(*k)) {
                out.push(format!("{at}.{k}: documented, missing"));
            }
            for k in o.keys().filter(|k| !d.contains_key(*k)) {
                out.push(format!("{at}.{k}: not documented"));
            }
            for (k, dv) in d {
                if let Some(ov) = o.get(k) {
                    shape_diff(&format!("{at}.{k}"), dv, ov, out);
                }
            }
        }
        (Value::Array(d), Value::Array(o)) => {
            if let Some(first) = d.first() {
                for (i, ov) in o.iter().enumerate() {
                    shape_diff(&format!("{at}[{i}]"), d.get(i).unwrap_or(first), ov, out);
                }
            }
        }
        (d, o) if kind(d) != kind(o) => {
            out.push(format!("{at}: documented {}, got {}", kind(d), kind(o)));
        }
        _ => {}
    }
}

// ---------------------------------------------------------------------------
// The public model.

/// How devices authenticate (`ControllerSecurityConfiguration`: every
/// request under `/{tenant}/controller/v1/**` must be authenticated,
/// anonymous access is disabled, and a failure is answered `401` with an
/// empty body).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Auth {
    /// No credentials asked: a reverse proxy authenticated the device
    /// (hawkBit's trusted-header authentication, not emulated further).
    None,
    /// `Authorization: TargetToken <token>` with the token of the
    /// controller named in the path (`SecurityTokenAuthenticator`).
    TargetToken,
    /// `Authorization: GatewayToken <token>` with the tenant's gateway
    /// token, for any controller (`GatewayTokenAuthenticator`).
    GatewayToken(String),
    /// Either of the two (hawkBit enables each independently).
    TargetOrGatewayToken(String),
}

/// One of the server's listeners.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Origin {
    /// The DDI API and its artifact downloads over HTTPS.
    Ddi,
    /// A download server of another origin over HTTPS.
    Cdn,
    /// The DDI API over plain HTTP (`download-http` links).
    Http,
}

/// Which download links an artifact has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Links {
    /// The four of the documented example (`DdiArtifact.java`,
    /// `DdiDeploymentBase.java`): `download` and `md5sum` over HTTPS (the
    /// DDI origin, or the [`Origin::Cdn`] one for [`Artifact::from_cdn`]),
    /// `download-http` and `md5sum-http` over plain HTTP, as a hawkBit
    /// configured with an HTTPS `download` protocol writes them.
    Documented,
    /// What hawkBit writes with its default configuration
    /// (`hawkbit-artifactdl-defaults.properties` defines only the
    /// `download-http` and `md5sum-http` protocols, whose
    /// `{protocolRequest}://{hostnameRequest}:{portRequest}` are those of
    /// the request): no `download` link at all, and a `download-http` link
    /// that is `https` when the device asked over HTTPS.
    HawkbitDefaults,
}

/// `deployment.download` and `deployment.update` (`DdiDeployment.HandlingType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handling {
    Skip,
    Attempt,
    Forced,
}

impl Handling {
    pub fn as_str(self) -> &'static str {
        match self {
            Handling::Skip => "skip",
            Handling::Attempt => "attempt",
            Handling::Forced => "forced",
        }
    }
}

/// `deployment.maintenanceWindow` (`DdiDeployment.DdiMaintenanceWindowStatus`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaintenanceWindow {
    Available,
    Unavailable,
}

impl MaintenanceWindow {
    pub fn as_str(self) -> &'static str {
        match self {
            MaintenanceWindow::Available => "available",
            MaintenanceWindow::Unavailable => "unavailable",
        }
    }
}

/// hawkBit's action types (`Action.ActionType`), which decide `download`
/// and `update` (`DdiRootController.calculateDownloadType` and
/// `calculateUpdateType`): `forced` for a forced or download-only action,
/// `attempt` for a soft one; `update` is `skip` for a download-only action
/// or while a maintenance window is unavailable, else as `download`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActionType {
    Soft,
    Forced,
    /// Download only: `download: forced`, `update: skip`; the action is
    /// closed by the device's `downloaded` feedback
    /// (`JpaControllerManagement.handleDownloadedActionStatus`).
    DownloadOnly,
}

/// One artifact of a [`Chunk`]: a local file served under its file name.
#[derive(Clone, Debug)]
pub struct Artifact {
    filename: String,
    path: PathBuf,
    origin: Origin,
}

impl Artifact {
    /// The file at `path`, served under its own file name from the DDI
    /// origin.
    ///
    /// # Panics
    /// When `path` has no file name.
    pub fn file(path: impl Into<PathBuf>) -> Artifact {
        let path = path.into();
        let filename = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| panic!("artifact path {} has no file name", path.display()));
        Artifact {
            filename,
            path,
            origin: Origin::Ddi,
        }
    }

    /// The file at `path`, served as `filename`.
    pub fn named(filename: &str, path: impl Into<PathBuf>) -> Artifact {
        Artifact {
            filename: filename.to_string(),
            path: path.into(),
            origin: Origin::Ddi,
        }
    }

    /// Link `download` (and `md5sum`) to the [`Origin::Cdn`] listener
    /// instead of the DDI API.
    pub fn from_cdn(mut self) -> Artifact {
        self.origin = Origin::Cdn;
        self
    }
}

/// One chunk (software module) of a [`Deployment`].
#[derive(Clone, Debug)]
pub struct Chunk {
    part: String,
    version: String,
    name: String,
    artifacts: Vec<Artifact>,
    metadata: Vec<(String, String)>,
}

impl Chunk {
    /// A chunk of `part` (`os`, `bApp`, `jvm`, …), `name` and `version`.
    pub fn new(part: &str, name: &str, version: &str) -> Chunk {
        Chunk {
            part: part.to_string(),
            version: version.to_string(),
            name: name.to_string(),
            artifacts: Vec::new(),
            metadata: Vec::new(),
        }
    }

    pub fn artifact(mut self, a: Artifact) -> Chunk {
        self.artifacts.push(a);
        self
    }

    /// The same chunk listed with another version (a distribution set
    /// that does not match its signed release).
    pub fn with_version(mut self, version: &str) -> Chunk {
        self.version = version.to_string();
        self
    }

    /// The software module's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many artifacts the module holds.
    pub fn artifacts(&self) -> usize {
        self.artifacts.len()
    }

    /// A target-visible metadata entry (`DdiChunk.metadata`).
    pub fn metadata(mut self, key: &str, value: &str) -> Chunk {
        self.metadata.push((key.to_string(), value.to_string()));
        self
    }
}

/// An action to assign to a controller ([`DdiServer::deploy`]).
#[derive(Clone, Debug)]
pub struct Deployment {
    action_id: u64,
    action_type: ActionType,
    window: Option<MaintenanceWindow>,
    handling: Option<(Handling, Handling)>,
    chunks: Vec<Chunk>,
    installed: bool,
}

impl Deployment {
    /// A forced action `action_id` (hawkBit's action ids are numbers).
    pub fn new(action_id: u64) -> Deployment {
        Deployment {
            action_id,
            action_type: ActionType::Forced,
            window: None,
            handling: None,
            chunks: Vec::new(),
            installed: false,
        }
    }

    pub fn action_type(mut self, t: ActionType) -> Deployment {
        self.action_type = t;
        self
    }

    /// A soft action: `download` and `update` are `attempt`.
    pub fn soft(self) -> Deployment {
        self.action_type(ActionType::Soft)
    }

    /// A download-only action.
    pub fn download_only(self) -> Deployment {
        self.action_type(ActionType::DownloadOnly)
    }

    /// A maintenance schedule whose window is now `w`.
    pub fn maintenance_window(mut self, w: MaintenanceWindow) -> Deployment {
        self.window = Some(w);
        self
    }

    /// Send these `download` and `update` values whatever the action type
    /// says (for shapes hawkBit itself never sends, such as
    /// `download: skip`); the action type still decides how feedback
    /// closes the action.
    pub fn handling(mut self, download: Handling, update: Handling) -> Deployment {
        self.handling = Some((download, update));
        self
    }

    pub fn chunk(mut self, c: Chunk) -> Deployment {
        self.chunks.push(c);
        self
    }

    /// An action that finished before the test: closed, and the
    /// controller's `installedBase`.
    pub fn installed(mut self) -> Deployment {
        self.installed = true;
        self
    }
}

/// `status.execution` (`DdiStatus.ExecutionStatus`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Execution {
    Closed,
    Proceeding,
    Canceled,
    Scheduled,
    Rejected,
    Resumed,
    Downloaded,
    Download,
}

impl Execution {
    pub const ALL: [Execution; 8] = [
        Execution::Closed,
        Execution::Proceeding,
        Execution::Canceled,
        Execution::Scheduled,
        Execution::Rejected,
        Execution::Resumed,
        Execution::Downloaded,
        Execution::Download,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Execution::Closed => "closed",
            Execution::Proceeding => "proceeding",
            Execution::Canceled => "canceled",
            Execution::Scheduled => "scheduled",
            Execution::Rejected => "rejected",
            Execution::Resumed => "resumed",
            Execution::Downloaded => "downloaded",
            Execution::Download => "download",
        }
    }

    fn parse(s: &str) -> Option<Execution> {
        Execution::ALL.into_iter().find(|e| e.as_str() == s)
    }
}

/// `status.result.finished` (`DdiResult.FinalResult`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finished {
    Success,
    Failure,
    None,
}

impl Finished {
    pub fn as_str(self) -> &'static str {
        match self {
            Finished::Success => "success",
            Finished::Failure => "failure",
            Finished::None => "none",
        }
    }

    fn parse(s: &str) -> Option<Finished> {
        [Finished::Success, Finished::Failure, Finished::None]
            .into_iter()
            .find(|f| f.as_str() == s)
    }
}

/// Which feedback resource a body was posted to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Channel {
    /// `…/deploymentBase/{id}/feedback`.
    Deployment,
    /// `…/cancelAction/{id}/feedback`.
    Cancel,
}

/// A body that breaks the documented schema, and whether hawkBit refuses
/// it (`400`) or takes it anyway.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// `METHOD path` of the request.
    pub request: String,
    /// The field, as a path (`status.result.finished`); `$` for the body.
    pub field: String,
    pub problem: String,
    /// hawkBit answers `400` for it. Where hawkBit's binding is lenient
    /// and its source shows it (`source`), this is false and the body is
    /// accepted; where only a JSON library's coercion could let it
    /// through, this server refuses it.
    pub refused: bool,
    /// The hawkBit file that makes the rule.
    pub source: &'static str,
}

/// `status.result.progress`, as sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    pub cnt: Option<i64>,
    pub of: Option<i64>,
}

/// One feedback body, accepted or not.
#[derive(Clone, Debug)]
pub struct Feedback {
    /// Position among every feedback posted, from 0.
    pub seq: usize,
    pub controller: String,
    /// The action id of the path, as sent.
    pub action: String,
    /// The action id of the path, when it is a number.
    pub action_id: Option<u64>,
    pub channel: Channel,
    /// The status answered.
    pub status: u16,
    pub execution: Option<Execution>,
    pub finished: Option<Finished>,
    pub progress: Option<Progress>,
    pub code: Option<i64>,
    pub details: Vec<String>,
    /// `timestamp` (ms since the epoch), when sent.
    pub timestamp: Option<i64>,
    /// Fields hawkBit ignores (its models ignore unknown properties), as
    /// paths: `id`, the action id older hawkBit versions took, is one.
    pub ignored_fields: Vec<String>,
    /// The schema violations found in the body (refused or not).
    pub violations: Vec<Violation>,
    /// The body as received.
    pub body: Vec<u8>,
}

impl Feedback {
    /// Whether the body was accepted (`200`).
    pub fn accepted(&self) -> bool {
        self.status == 200
    }
}

/// An action's status as hawkBit keeps it (`Action.Status`, the values the
/// DDI flow reaches).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActionStatus {
    Running,
    Retrieved,
    Canceling,
    Canceled,
    Finished,
    Error,
    Downloaded,
}

impl ActionStatus {
    /// The name hawkBit writes in `actionHistory.status`.
    pub fn name(self) -> &'static str {
        match self {
            ActionStatus::Running => "RUNNING",
            ActionStatus::Retrieved => "RETRIEVED",
            ActionStatus::Canceling => "CANCELING",
            ActionStatus::Canceled => "CANCELED",
            ActionStatus::Finished => "FINISHED",
            ActionStatus::Error => "ERROR",
            ActionStatus::Downloaded => "DOWNLOADED",
        }
    }

    fn canceling_or_canceled(self) -> bool {
        matches!(self, ActionStatus::Canceling | ActionStatus::Canceled)
    }
}

/// The status of one entry of an action's history (`Action.Status` as
/// stored in an `ActionStatus`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryStatus {
    Running,
    Retrieved,
    Download,
    Downloaded,
    Warning,
    Canceling,
    Canceled,
    CancelRejected,
    Finished,
    Error,
}

impl EntryStatus {
    /// Intermediate statuses count against the status quota
    /// (`JpaActionManagement.isIntermediateStatus`: all but FINISHED and
    /// ERROR).
    fn intermediate(self) -> bool {
        !matches!(self, EntryStatus::Finished | EntryStatus::Error)
    }
}

/// One entry of an action's status history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusEntry {
    pub status: EntryStatus,
    /// The messages stored (device details cut into
    /// [`MESSAGE_ENTRY_LENGTH`] pieces, the status code line, the server's
    /// own messages starting with [`SERVER_MESSAGE_PREFIX`]).
    pub messages: Vec<String>,
    /// Made by a device feedback (not by the server).
    pub by_device: bool,
    /// The feedback's `timestamp`, or the server's clock.
    pub timestamp_ms: i64,
}

/// What the server holds about one action.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActionView {
    pub id: u64,
    pub controller: String,
    pub action_type: ActionType,
    pub status: ActionStatus,
    /// Open: feedback is taken (a closed action answers `410`).
    pub active: bool,
    pub history: Vec<StatusEntry>,
}

impl ActionView {
    /// Closed with FINISHED (the device reported `closed` with `success`
    /// or `none`).
    pub fn finished(&self) -> bool {
        !self.active && self.status == ActionStatus::Finished
    }
}

/// One request, as answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestRecord {
    pub seq: usize,
    pub origin: Origin,
    pub method: String,
    /// Path and query, as sent.
    pub target: String,
    /// The `Authorization` header, as sent.
    pub authorization: Option<String>,
    pub range: Option<String>,
    pub if_none_match: Option<String>,
    pub accept: Option<String>,
    pub content_type: Option<String>,
    pub status: u16,
    /// Body bytes written (less than announced when cut).
    pub body_bytes: u64,
    pub received: SystemTime,
}

impl RequestRecord {
    /// The path, without the query.
    pub fn path(&self) -> &str {
        path_of(&self.target)
    }
}

/// One `PUT …/configData`.
#[derive(Clone, Debug)]
pub struct ConfigDataPut {
    pub seq: usize,
    pub controller: String,
    pub status: u16,
    /// `mode` as sent.
    pub mode: Option<String>,
    /// `data` as sent (a `null` value is `None`).
    pub data: BTreeMap<String, Option<String>>,
    pub ignored_fields: Vec<String>,
    pub violations: Vec<Violation>,
    pub body: Vec<u8>,
}

// ---------------------------------------------------------------------------
// The server.

/// Configuration of a [`DdiServer`]; see [`DdiServer::builder`].
pub struct DdiServerBuilder<'a> {
    tenant: String,
    auth: Auth,
    ca: Option<&'a TestCa>,
    sleep: String,
    status_quota: usize,
    message_quota: usize,
    attribute_quota: usize,
    links: Links,
    idle_timeout: Duration,
    ddi_behind: Option<SocketAddr>,
}

impl<'a> DdiServerBuilder<'a> {
    /// Name `addr` instead of the API's own listener in the server's URL
    /// and in every link it hands out: a proxy there (forwarding to
    /// [`DdiServer::addr`]`(Origin::Ddi)`) then stands between the device
    /// and the API and its downloads, as a network does.
    pub fn ddi_behind(mut self, addr: SocketAddr) -> Self {
        self.ddi_behind = Some(addr);
        self
    }

    /// Which download links artifacts get (default [`Links::Documented`]).
    pub fn links(mut self, links: Links) -> Self {
        self.links = links;
        self
    }

    /// How devices authenticate (default [`Auth::TargetToken`]).
    pub fn auth(mut self, auth: Auth) -> Self {
        self.auth = auth;
        self
    }

    /// Issue the certificates from `ca` (by default a fresh CA is made;
    /// either way its PEM is at [`DdiServer::ca_file`]).
    pub fn ca(mut self, ca: &'a TestCa) -> Self {
        self.ca = Some(ca);
        self
    }

    /// `config.polling.sleep` (`HH:MM:SS`, default [`DEFAULT_SLEEP`]).
    pub fn sleep(mut self, hh_mm_ss: &str) -> Self {
        self.sleep = hh_mm_ss.to_string();
        self
    }

    /// `maxStatusEntriesPerAction` (default [`DEFAULT_STATUS_QUOTA`]; 0
    /// is unlimited, as in `QuotaHelper`).
    pub fn status_quota(mut self, n: usize) -> Self {
        self.status_quota = n;
        self
    }

    /// `maxMessagesPerActionStatus` (default [`DEFAULT_MESSAGE_QUOTA`]).
    pub fn message_quota(mut self, n: usize) -> Self {
        self.message_quota = n;
        self
    }

    /// `maxAttributeEntriesPerTarget` (default [`DEFAULT_ATTRIBUTE_QUOTA`]).
    pub fn attribute_quota(mut self, n: usize) -> Self {
        self.attribute_quota = n;
        self
    }

    /// How long a connection may wait for the client (default 30 s).
    pub fn idle_timeout(mut self, t: Duration) -> Self {
        self.idle_timeout = t;
        self
    }

    /// Bind the three loopback listeners and start serving.
    pub fn start(self) -> io::Result<DdiServer> {
        if self.tenant.is_empty() || self.tenant.contains(['/', '?', '#', '%']) {
            return Err(io::Error::other(format!(
                "DDI tenant {:?} must be a plain path segment",
                self.tenant
            )));
        }
        let dir = tempfile::Builder::new()
            .prefix("updraft-ddi-")
            .tempdir()
            .map_err(|e| io::Error::new(e.kind(), format!("making the DDI server's dir: {e}")))?;
        let fresh;
        let ca = match self.ca {
            Some(ca) => ca,
            None => {
                fresh = TestCa::new("updraft DDI test CA")?;
                &fresh
            }
        };
        let ca_file = dir.path().join("ca.pem");
        ca.write_cert(&ca_file)?;
        let ddi_listener = bind_loopback("DDI server")?;
        let cdn_listener = bind_loopback("DDI download server")?;
        let http_listener = bind_loopback("DDI plain-HTTP server")?;
        let urls = Urls {
            tenant: self.tenant.clone(),
            ddi: format!(
                "https://{}",
                self.ddi_behind
                    .map_or_else(|| ddi_listener.local_addr(), Ok)?
            ),
            cdn: format!("https://{}", cdn_listener.local_addr()?),
            http: format!("http://{}", http_listener.local_addr()?),
        };
        let shared = Arc::new(Shared {
            urls,
            tls: Arc::new(tls_server_config(ca)?),
            idle_timeout: self.idle_timeout,
            state: Mutex::new(State {
                auth: self.auth,
                sleep: self.sleep,
                status_quota: self.status_quota,
                message_quota: self.message_quota,
                attribute_quota: self.attribute_quota,
                links: self.links,
                controllers: BTreeMap::new(),
                actions: BTreeMap::new(),
                modules: BTreeMap::new(),
                requests: Vec::new(),
                feedback: Vec::new(),
                config_puts: Vec::new(),
                violations: Vec::new(),
                throttle: BTreeMap::new(),
                cuts: BTreeMap::new(),
                served: BTreeMap::new(),
                generation: 0,
            }),
            changed: Condvar::new(),
        });
        let listener = |name: &str, origin: Origin, l| {
            let s = Arc::clone(&shared);
            Acceptor::start(name, l, 64, move |stream, peer, _, stop| {
                serve(&s, origin, stream, peer, stop)
            })
        };
        let ddi = listener("ddi", Origin::Ddi, ddi_listener)?;
        let cdn = listener("ddi-cdn", Origin::Cdn, cdn_listener)?;
        let http = listener("ddi-http", Origin::Http, http_listener)?;
        Ok(DdiServer {
            ddi,
            cdn,
            http,
            ca_file,
            _dir: dir,
            shared,
        })
    }
}

/// A running DDI server; stopped when dropped. See the module doc.
pub struct DdiServer {
    // The listeners go first: dropping them joins every connection thread.
    ddi: Acceptor,
    cdn: Acceptor,
    http: Acceptor,
    ca_file: PathBuf,
    _dir: tempfile::TempDir,
    shared: Arc<Shared>,
}

struct Shared {
    urls: Urls,
    tls: Arc<ServerConfig>,
    idle_timeout: Duration,
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Run `f` on the state and wake the waiters.
    fn change<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut st = self.lock();
        let out = f(&mut st);
        st.generation += 1;
        self.changed.notify_all();
        out
    }
}

#[derive(Clone)]
struct Urls {
    tenant: String,
    ddi: String,
    cdn: String,
    http: String,
}

impl Urls {
    /// `https://127.0.0.1:P/{tenant}/controller/v1/{id}`.
    fn controller(&self, base: &str, controller: &str) -> String {
        format!(
            "{base}/{}/controller/v1/{}",
            self.tenant,
            percent_encode(controller)
        )
    }
}

impl DdiServer {
    /// A builder for a server of `tenant`.
    pub fn builder<'a>(tenant: &str) -> DdiServerBuilder<'a> {
        DdiServerBuilder {
            tenant: tenant.to_string(),
            auth: Auth::TargetToken,
            ca: None,
            sleep: DEFAULT_SLEEP.to_string(),
            status_quota: DEFAULT_STATUS_QUOTA,
            message_quota: DEFAULT_MESSAGE_QUOTA,
            attribute_quota: DEFAULT_ATTRIBUTE_QUOTA,
            links: Links::Documented,
            idle_timeout: Duration::from_secs(30),
            ddi_behind: None,
        }
    }

    /// A server of `tenant` with target-token authentication, a fresh CA
    /// and the defaults.
    pub fn start(tenant: &str) -> io::Result<DdiServer> {
        DdiServer::builder(tenant).start()
    }

    /// `https://127.0.0.1:PORT` of the DDI API.
    pub fn base_url(&self) -> String {
        self.shared.urls.ddi.clone()
    }

    /// `https://127.0.0.1:PORT` of the [`Origin::Cdn`] listener.
    pub fn cdn_url(&self) -> String {
        self.shared.urls.cdn.clone()
    }

    /// `http://127.0.0.1:PORT` of the [`Origin::Http`] listener.
    pub fn http_url(&self) -> String {
        self.shared.urls.http.clone()
    }

    /// The address of a listener.
    pub fn addr(&self, origin: Origin) -> SocketAddr {
        match origin {
            Origin::Ddi => self.ddi.addr(),
            Origin::Cdn => self.cdn.addr(),
            Origin::Http => self.http.addr(),
        }
    }

    pub fn tenant(&self) -> &str {
        &self.shared.urls.tenant
    }

    /// PEM file of the CA that issued both HTTPS listeners' certificates.
    pub fn ca_file(&self) -> &Path {
        &self.ca_file
    }

    /// `https://127.0.0.1:PORT/{tenant}/controller/v1/{controller}`: the
    /// controller base a device polls.
    pub fn controller_url(&self, controller: &str) -> String {
        self.shared
            .urls
            .controller(&self.shared.urls.ddi, controller)
    }

    /// Register `controller` with its target token (hawkBit registers a
    /// target that polls with a gateway token, or through a proxy, on its
    /// first poll; one that uses its target token must exist first).
    pub fn add_controller(&self, controller: &str, target_token: &str) {
        self.shared.change(|st| {
            let c = st.controllers.entry(controller.to_string()).or_default();
            c.token = Some(target_token.to_string());
        });
    }

    /// Whether `controller` is registered (by [`DdiServer::add_controller`]
    /// or by a poll).
    pub fn has_controller(&self, controller: &str) -> bool {
        self.shared.lock().controllers.contains_key(controller)
    }

    /// `config.polling.sleep` from now on (`HH:MM:SS`).
    pub fn set_sleep(&self, hh_mm_ss: &str) {
        self.shared.change(|st| st.sleep = hh_mm_ss.to_string());
    }

    /// Show the `configData` link to `controller` again, as hawkBit does
    /// when an operator asks for the attributes.
    pub fn request_config_data(&self, controller: &str) {
        self.shared.change(|st| {
            st.controller_mut(controller).request_attributes = true;
        });
    }

    /// The status quota from now on (0: unlimited).
    pub fn set_status_quota(&self, n: usize) {
        self.shared.change(|st| st.status_quota = n);
    }

    /// The message quota from now on.
    pub fn set_message_quota(&self, n: usize) {
        self.shared.change(|st| st.message_quota = n);
    }

    /// Assign `d` to `controller`: its artifacts are read now (size, MD5,
    /// SHA-1, SHA-256), each chunk becomes a software module with an id of
    /// its own, and the action gets its first status entry (RUNNING, as an
    /// assignment makes one).
    ///
    /// # Panics
    /// When the controller is not registered, the action id is taken, an
    /// artifact cannot be read, or a chunk names a file twice.
    pub fn deploy(&self, controller: &str, d: Deployment) {
        let mut modules = Vec::new();
        for c in &d.chunks {
            let mut files = Vec::new();
            for a in &c.artifacts {
                assert!(
                    !files
                        .iter()
                        .any(|f: &ArtifactFile| f.filename == a.filename),
                    "chunk {:?} names {:?} twice",
                    c.part,
                    a.filename
                );
                files.push(ArtifactFile::read(a));
            }
            modules.push((c, files));
        }
        self.shared.change(|st| {
            assert!(
                st.controllers.contains_key(controller),
                "deploying to unknown controller {controller:?}: add_controller first"
            );
            assert!(
                !st.actions.contains_key(&d.action_id),
                "action {} exists already",
                d.action_id
            );
            let mut ids = Vec::new();
            for (c, files) in modules {
                let id = st.modules.keys().next_back().map_or(1, |k| k + 1);
                st.modules.insert(
                    id,
                    Module {
                        id,
                        part: c.part.clone(),
                        version: c.version.clone(),
                        name: c.name.clone(),
                        metadata: c.metadata.clone(),
                        artifacts: files,
                    },
                );
                ids.push(id);
            }
            let now = now_ms();
            let mut action = ActionState {
                id: d.action_id,
                controller: controller.to_string(),
                action_type: d.action_type,
                window: d.window,
                handling: d.handling,
                modules: ids,
                active: true,
                status: ActionStatus::Running,
                history: vec![StatusEntry {
                    status: EntryStatus::Running,
                    messages: vec![format!("{SERVER_MESSAGE_PREFIX}Assignment initiated.")],
                    by_device: false,
                    timestamp_ms: now,
                }],
            };
            if d.installed {
                action.active = false;
                action.status = ActionStatus::Finished;
                action.history.push(StatusEntry {
                    status: EntryStatus::Finished,
                    messages: vec![format!("{SERVER_MESSAGE_PREFIX}Installed before the test.")],
                    by_device: false,
                    timestamp_ms: now,
                });
                let c = st.controller_mut(controller);
                c.installed = Some(d.action_id);
                c.installation_date = Some(now);
            }
            st.actions.insert(d.action_id, action);
        });
    }

    /// Cancel action `action_id` of `controller`, as hawkBit's management
    /// API does (`JpaControllerManagement.cancelAction`): the action, still
    /// active, goes CANCELING with a CANCELING entry, and the controller
    /// base shows `_links.cancelAction` to `…/cancelAction/{action_id}`.
    /// hawkBit's cancel action has the id of the action it stops
    /// (`DdiRootController.getControllerCancelAction`: `id` and `stopId`
    /// are both the action's id).
    ///
    /// # Panics
    /// When the action is not an active action of `controller` or is
    /// canceling already (hawkBit refuses: `CancelActionNotAllowedException`).
    pub fn cancel(&self, controller: &str, action_id: u64) {
        self.shared.change(|st| {
            let a = st
                .actions
                .get_mut(&action_id)
                .filter(|a| a.controller == controller)
                .unwrap_or_else(|| panic!("{controller:?} has no action {action_id}"));
            assert!(
                a.active && !a.status.canceling_or_canceled(),
                "action {action_id} is not cancelable (active: {}, {:?})",
                a.active,
                a.status
            );
            a.status = ActionStatus::Canceling;
            a.history.push(StatusEntry {
                status: EntryStatus::Canceling,
                messages: vec!["manual cancelation requested".into()],
                by_device: false,
                timestamp_ms: now_ms(),
            });
        });
    }

    /// The maintenance window of action `action_id` from now on (`None`:
    /// no schedule). The `?c=` hash of its link changes with it, as
    /// hawkBit's does (`DataConversionHelper.calculateEtag`).
    pub fn set_maintenance_window(&self, action_id: u64, w: Option<MaintenanceWindow>) {
        self.shared.change(|st| {
            st.actions
                .get_mut(&action_id)
                .unwrap_or_else(|| panic!("no action {action_id}"))
                .window = w;
        });
    }

    /// Answer the next `n` requests to the DDI API (both DDI listeners)
    /// `429 Too Many Requests`, with `Retry-After: <seconds>` when given,
    /// then answer normally again. hawkBit's own DoS filter answers `429`
    /// with no `Retry-After` and no body (`DosFilter.handleReadRequest`);
    /// a proxy in front of it may add one.
    pub fn throttle(&self, n: u32, retry_after: Option<u32>) {
        self.shared.change(|st| {
            st.throttle.insert(Origin::Ddi, (n, retry_after));
            st.throttle.insert(Origin::Http, (n, retry_after));
        });
    }

    /// As [`DdiServer::throttle`], for one listener only.
    pub fn throttle_origin(&self, origin: Origin, n: u32, retry_after: Option<u32>) {
        self.shared
            .change(|st| st.throttle.insert(origin, (n, retry_after)));
    }

    /// The next body served for artifact `filename` (any listener, full or
    /// ranged) stops after `after` bytes and the connection is dropped
    /// without an orderly close; later ones are whole.
    pub fn cut_once(&self, filename: &str, after: u64) {
        self.shared
            .change(|st| st.cuts.insert(filename.to_string(), after));
    }

    /// Every request answered so far, oldest first.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared.lock().requests.clone()
    }

    /// The requests one listener answered.
    pub fn requests_to(&self, origin: Origin) -> Vec<RequestRecord> {
        let st = self.shared.lock();
        st.requests
            .iter()
            .filter(|r| r.origin == origin)
            .cloned()
            .collect()
    }

    /// The feedback accepted for action `action_id` (both channels), in
    /// arrival order.
    pub fn feedback(&self, action_id: u64) -> Vec<Feedback> {
        let st = self.shared.lock();
        st.feedback
            .iter()
            .filter(|f| f.accepted() && f.action_id == Some(action_id))
            .cloned()
            .collect()
    }

    /// Every feedback body posted, accepted or not, in arrival order.
    pub fn feedback_log(&self) -> Vec<Feedback> {
        self.shared.lock().feedback.clone()
    }

    /// Every schema violation found in a feedback or configData body, in
    /// arrival order. A conforming client leaves this empty.
    pub fn violations(&self) -> Vec<Violation> {
        self.shared.lock().violations.clone()
    }

    /// What the server holds about action `action_id`.
    ///
    /// # Panics
    /// When there is no such action.
    pub fn action(&self, action_id: u64) -> ActionView {
        let st = self.shared.lock();
        st.actions
            .get(&action_id)
            .map(ActionState::view)
            .unwrap_or_else(|| panic!("no action {action_id}"))
    }

    /// The attributes stored for `controller` from its `configData`.
    pub fn attributes(&self, controller: &str) -> BTreeMap<String, String> {
        let st = self.shared.lock();
        st.controllers
            .get(controller)
            .map(|c| c.attributes.clone())
            .unwrap_or_default()
    }

    /// Whether the controller base shows `controller` the `configData` link.
    pub fn wants_config_data(&self, controller: &str) -> bool {
        let st = self.shared.lock();
        st.controllers
            .get(controller)
            .is_some_and(|c| c.request_attributes)
    }

    /// Every `PUT …/configData`, in arrival order.
    pub fn config_data_log(&self) -> Vec<ConfigDataPut> {
        self.shared.lock().config_puts.clone()
    }

    /// Body bytes of artifact `filename` served by every listener (not
    /// counting its `.MD5SUM`).
    pub fn bytes_served(&self, filename: &str) -> u64 {
        let st = self.shared.lock();
        st.served
            .iter()
            .filter(|((_, f), _)| f == filename)
            .map(|(_, n)| n)
            .sum()
    }

    /// Body bytes served for artifact `filename` by one listener.
    pub fn bytes_served_by(&self, origin: Origin, filename: &str) -> u64 {
        let st = self.shared.lock();
        st.served
            .get(&(origin, filename.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// Wait until `done` holds or `timeout` passes; returns whether it
    /// held. `done` is asked again after every change the server sees.
    pub fn wait_until(&self, timeout: Duration, mut done: impl FnMut(&DdiServer) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let generation = self.shared.lock().generation;
            if done(self) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            let st = self.shared.lock();
            if st.generation == generation {
                let _ = self.shared.changed.wait_timeout(st, deadline - now);
            }
        }
    }

    /// Wait until `n` feedback bodies are accepted for `action_id`;
    /// returns them either way (the caller asserts).
    pub fn wait_for_feedback(&self, action_id: u64, n: usize, timeout: Duration) -> Vec<Feedback> {
        self.wait_until(timeout, |s| s.feedback(action_id).len() >= n);
        self.feedback(action_id)
    }

    /// Wait until action `action_id` is closed; returns it either way.
    pub fn wait_for_closed(&self, action_id: u64, timeout: Duration) -> ActionView {
        self.wait_until(timeout, |s| !s.action(action_id).active);
        self.action(action_id)
    }
}

// ---------------------------------------------------------------------------
// The state.

struct State {
    auth: Auth,
    sleep: String,
    status_quota: usize,
    message_quota: usize,
    attribute_quota: usize,
    links: Links,
    controllers: BTreeMap<String, Controller>,
    actions: BTreeMap<u64, ActionState>,
    modules: BTreeMap<u64, Module>,
    requests: Vec<RequestRecord>,
    feedback: Vec<Feedback>,
    config_puts: Vec<ConfigDataPut>,
    /// Every violation found, in arrival order.
    violations: Vec<Violation>,
    /// Requests left to throttle per listener, and the Retry-After.
    throttle: BTreeMap<Origin, (u32, Option<u32>)>,
    /// Armed cuts: file name → body bytes before the cut.
    cuts: BTreeMap<String, u64>,
    served: BTreeMap<(Origin, String), u64>,
    generation: u64,
}

struct Controller {
    token: Option<String>,
    attributes: BTreeMap<String, String>,
    /// The controller base shows `configData` (`JpaTarget`: true for a new
    /// target; set again when an action finishes or a download-only action
    /// is downloaded; cleared by a `configData` PUT).
    request_attributes: bool,
    installed: Option<u64>,
    installation_date: Option<i64>,
}

impl Default for Controller {
    fn default() -> Controller {
        Controller {
            token: None,
            attributes: BTreeMap::new(),
            request_attributes: true,
            installed: None,
            installation_date: None,
        }
    }
}

struct ActionState {
    id: u64,
    controller: String,
    action_type: ActionType,
    window: Option<MaintenanceWindow>,
    handling: Option<(Handling, Handling)>,
    modules: Vec<u64>,
    active: bool,
    status: ActionStatus,
    history: Vec<StatusEntry>,
}

impl ActionState {
    fn view(&self) -> ActionView {
        ActionView {
            id: self.id,
            controller: self.controller.clone(),
            action_type: self.action_type,
            status: self.status,
            active: self.active,
            history: self.history.clone(),
        }
    }

    /// `download` and `update` (`DdiRootController.calculateDownloadType`,
    /// `calculateUpdateType`).
    fn handling(&self) -> (Handling, Handling) {
        if let Some(h) = self.handling {
            return h;
        }
        let download = match self.action_type {
            ActionType::DownloadOnly | ActionType::Forced => Handling::Forced,
            ActionType::Soft => Handling::Attempt,
        };
        let update = if self.action_type == ActionType::DownloadOnly {
            Handling::Skip
        } else {
            match self.window {
                Some(MaintenanceWindow::Unavailable) => Handling::Skip,
                _ => download,
            }
        };
        (download, update)
    }

    /// The `?c=` value of the `deploymentBase` link: hawkBit hashes the
    /// action and whether it is forced or in its window
    /// (`DataConversionHelper.calculateEtag`), so the link changes when the
    /// handling does. Here: a Java-style hash of what the document shows.
    fn etag_hash(&self) -> i32 {
        let (d, u) = self.handling();
        let mut h: i32 = 17;
        for x in [
            self.id as i32,
            (self.id >> 32) as i32,
            d as i32,
            u as i32,
            match self.window {
                None => 1237,
                Some(MaintenanceWindow::Available) => 1249,
                Some(MaintenanceWindow::Unavailable) => 1231,
            },
        ] {
            h = h.wrapping_mul(31).wrapping_add(x);
        }
        h
    }

    /// Whether one more entry of `status` fits the status quota: only
    /// intermediate ones are checked (`JpaActionManagement.assertActionStatusQuota`:
    /// `count + 1 > limit` fails; `QuotaHelper`: a limit of 0 is none).
    fn quota_allows(&self, status: EntryStatus, quota: usize) -> bool {
        !(status.intermediate() && quota > 0 && self.history.len() + 1 > quota)
    }
}

impl State {
    fn controller_mut(&mut self, id: &str) -> &mut Controller {
        self.controllers
            .get_mut(id)
            .unwrap_or_else(|| panic!("unknown controller {id:?}"))
    }

    /// The action the controller base shows: the oldest active one
    /// (`JpaControllerManagement.findActiveActionWithHighestWeight`
    /// without weights: lowest id first).
    fn active_action(&self, controller: &str) -> Option<&ActionState> {
        self.actions
            .values()
            .find(|a| a.controller == controller && a.active)
    }

    /// A new feedback sequence number.
    fn next_feedback_seq(&self) -> usize {
        self.feedback.len()
    }
}

struct Module {
    id: u64,
    part: String,
    version: String,
    name: String,
    metadata: Vec<(String, String)>,
    artifacts: Vec<ArtifactFile>,
}

#[derive(Clone)]
struct ArtifactFile {
    filename: String,
    path: PathBuf,
    origin: Origin,
    size: u64,
    md5: String,
    sha1: String,
    sha256: String,
}

impl ArtifactFile {
    fn read(a: &Artifact) -> ArtifactFile {
        let mut f = File::open(&a.path)
            .unwrap_or_else(|e| panic!("reading artifact {}: {e}", a.path.display()));
        let mut md5 = md5::Md5::new();
        let mut sha1 = ring::digest::Context::new(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY);
        let mut sha256 = ring::digest::Context::new(&ring::digest::SHA256);
        let mut buf = vec![0u8; 64 * 1024];
        let mut size = 0u64;
        loop {
            let n = f
                .read(&mut buf)
                .unwrap_or_else(|e| panic!("reading artifact {}: {e}", a.path.display()));
            if n == 0 {
                break;
            }
            md5.update(&buf[..n]);
            sha1.update(&buf[..n]);
            sha256.update(&buf[..n]);
            size += n as u64;
        }
        ArtifactFile {
            filename: a.filename.clone(),
            path: a.path.clone(),
            origin: a.origin,
            size,
            md5: updraft::hash::hex(&md5.finalize()),
            sha1: updraft::hash::hex(sha1.finish().as_ref()),
            sha256: updraft::hash::hex(sha256.finish().as_ref()),
        }
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------
// Connections.

fn serve(shared: &Shared, origin: Origin, stream: TcpStream, _peer: SocketAddr, stop: &AtomicBool) {
    let _ = stream.set_read_timeout(Some(shared.idle_timeout));
    let _ = stream.set_write_timeout(Some(shared.idle_timeout));
    let _ = stream.set_nodelay(true);
    if origin == Origin::Http {
        serve_on(shared, origin, HttpConn::new(stream, "updraft-ddi"), stop);
        return;
    }
    match ServerConnection::new(Arc::clone(&shared.tls)) {
        Ok(c) => serve_on(
            shared,
            origin,
            HttpConn::new(StreamOwned::new(c, stream), "updraft-ddi"),
            stop,
        ),
        Err(e) => eprintln!("DDI server: TLS: {e}"),
    }
}

fn serve_on<S: Transport>(
    shared: &Shared,
    origin: Origin,
    mut http: HttpConn<S>,
    stop: &AtomicBool,
) {
    while !stop.load(Ordering::SeqCst) {
        let head = match http.read_head() {
            Ok(Some(h)) => h,
            Ok(None) | Err(_) => break,
        };
        let req = match parse_head(&head) {
            Ok(r) => r,
            Err(why) => {
                let mut r = Response::text(400, &format!("{why}\n"));
                r.close = true;
                let _ = http.write(&r, true);
                break;
            }
        };
        let (mut reply, body_ok) = match http.read_body(&req, MAX_BODY) {
            Ok(body) => (answer(shared, origin, &req, &body), true),
            Err(r) => (Reply::plain(r), false),
        };
        if !req.keep_alive() || !body_ok {
            reply.response.close = true;
        }
        let cut = reply
            .file
            .as_ref()
            .filter(|_| req.method != "HEAD")
            .and_then(|f| shared.change(|st| st.cuts.remove(f)));
        // Recorded before the answer is written, with the body bytes it
        // will carry, so that a client that has read the answer finds it
        // in the log; corrected below if the write falls short.
        let planned = match (&reply.response.body, req.method == "HEAD") {
            (_, true) | (Body::Empty, _) => 0,
            _ => reply
                .response
                .length
                .unwrap_or(0)
                .min(cut.unwrap_or(u64::MAX)),
        };
        let seq = shared.change(|st| {
            if let Some(f) = &reply.file {
                *st.served.entry((origin, f.clone())).or_default() += planned;
            }
            let seq = st.requests.len();
            let h = |n: &str| req.header(n).map(str::to_string);
            st.requests.push(RequestRecord {
                seq,
                origin,
                method: req.method.clone(),
                target: req.target.clone(),
                authorization: h("authorization"),
                range: h("range"),
                if_none_match: h("if-none-match"),
                accept: h("accept"),
                content_type: h("content-type"),
                status: reply.response.status,
                body_bytes: planned,
                received: SystemTime::now(),
            });
            seq
        });
        let written = http.write_cut(&reply.response, req.method != "HEAD", cut);
        let body_bytes = written.as_ref().map(|s| s.body).unwrap_or(0);
        if body_bytes != planned {
            shared.change(|st| {
                if let Some(f) = &reply.file {
                    let n = st.served.entry((origin, f.clone())).or_default();
                    *n = *n - planned + body_bytes;
                }
                st.requests[seq].body_bytes = body_bytes;
            });
        }
        match written {
            Ok(s) if !s.cut && !reply.response.close => {}
            Ok(s) if s.cut => return,
            _ => break,
        }
    }
    http.stream.close();
}

/// A response, and the artifact it serves (for the byte count and cuts).
struct Reply {
    response: Response,
    file: Option<String>,
}

impl Reply {
    fn plain(response: Response) -> Reply {
        Reply {
            response,
            file: None,
        }
    }
}

fn answer(shared: &Shared, origin: Origin, req: &Request, body: &[u8]) -> Reply {
    shared.change(|st| {
        if let Some((left, retry_after)) = st.throttle.get_mut(&origin) {
            if *left > 0 {
                *left -= 1;
                let mut r = Response::new(429);
                if let Some(s) = retry_after {
                    r = r.header("Retry-After", s.to_string());
                }
                return Reply::plain(r);
            }
        }
        match origin {
            Origin::Cdn => cdn(st, &shared.urls, req),
            Origin::Ddi | Origin::Http => ddi(st, &shared.urls, origin, req, body),
        }
    })
}

// ---------------------------------------------------------------------------
// The DDI API.

/// The JSON media type to answer with, or `None` for `406`: the DDI
/// resources produce `application/hal+json`, `application/json` and CBOR
/// (`DdiRootControllerRestApi`, `produces`); CBOR is not emulated.
fn negotiate(req: &Request) -> Option<&'static str> {
    let Some(accept) = req.header("accept") else {
        return Some("application/hal+json");
    };
    let ranges: Vec<String> = accept
        .split(',')
        .map(|r| {
            r.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .collect();
    if ranges.iter().any(|r| r == "application/hal+json") {
        Some("application/hal+json")
    } else if ranges.iter().any(|r| r == "application/json") {
        Some("application/json")
    } else if ranges.iter().any(|r| r == "*/*" || r == "application/*") {
        Some("application/hal+json")
    } else {
        None
    }
}

/// Whether a request body is declared JSON (`consumes` JSON or CBOR;
/// anything else is `415`, CBOR here too).
fn json_body(req: &Request) -> bool {
    req.header("content-type")
        .map(|c| {
            c.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .is_some_and(|c| c == "application/json")
}

/// hawkBit's error body (`RestConfiguration.ResponseExceptionHandler`:
/// `ExceptionInfo` with `exceptionClass`, `errorCode` and `message`).
fn exception(status: u16, class: &str, code: &str, message: &str) -> Response {
    let body = Json::obj(vec![
        ("exceptionClass", Json::str(class)),
        ("errorCode", Json::str(code)),
        ("message", Json::str(message)),
    ]);
    Response::bytes(status, "application/json", body.render().into_bytes())
}

/// `400` for a body that does not bind (`MessageNotReadableException`,
/// `SP_REST_BODY_NOT_READABLE`).
fn not_readable() -> Response {
    exception(
        400,
        "org.eclipse.hawkbit.rest.exception.MessageNotReadableException",
        "hawkbit.server.error.rest.body.notReadable",
        "The given request body is not well formed",
    )
}

/// `404` for an unknown target, action or module (`EntityNotFoundException`).
fn not_found(what: &str) -> Response {
    exception(
        404,
        "org.eclipse.hawkbit.repository.exception.EntityNotFoundException",
        "hawkbit.server.error.repo.entityNotFound",
        &format!("{what} does not exist"),
    )
}

/// `429` for a quota (`AssignmentQuotaExceededException`,
/// `SP_QUOTA_EXCEEDED` → `TOO_MANY_REQUESTS` in `RestConfiguration`).
fn quota_exceeded(what: &str) -> Response {
    exception(
        429,
        "org.eclipse.hawkbit.repository.exception.AssignmentQuotaExceededException",
        "hawkbit.server.error.quota.tooManyEntries",
        what,
    )
}

fn method_not_allowed(allow: &'static str) -> Response {
    Response::new(405).header("Allow", allow)
}

/// A JSON answer to a `GET`, with Spring's shallow ETag (`RestConfiguration`
/// installs `ShallowEtagHeaderFilter` on the DDI resources: `"0"` and the
/// MD5 of the body, in quotes) and `304` when `If-None-Match` names it.
fn json_answer(req: &Request, media: &str, body: String) -> Response {
    let tag = format!(
        "\"0{}\"",
        updraft::hash::hex(&md5::Md5::digest(body.as_bytes()))
    );
    if let Some(inm) = req.header("if-none-match") {
        if inm.split(',').any(|t| t.trim() == tag || t.trim() == "*") {
            let mut r = Response::new(304).header("ETag", tag);
            r.length = None;
            return r;
        }
    }
    Response::bytes(200, media, body.into_bytes()).header("ETag", tag)
}

/// What the path under `/{tenant}/controller/v1/{controllerId}` names.
enum Route<'a> {
    Base,
    DeploymentBase(&'a str),
    DeploymentFeedback(&'a str),
    CancelAction(&'a str),
    CancelFeedback(&'a str),
    InstalledBase(&'a str),
    ConfigData,
    Artifact(&'a str, String),
    Md5Sum(&'a str, String),
    Unknown,
}

fn route<'a>(rest: &'a [&'a str]) -> Route<'a> {
    match rest {
        [] => Route::Base,
        ["deploymentBase", id] => Route::DeploymentBase(id),
        ["deploymentBase", id, "feedback"] => Route::DeploymentFeedback(id),
        ["cancelAction", id] => Route::CancelAction(id),
        ["cancelAction", id, "feedback"] => Route::CancelFeedback(id),
        ["installedBase", id] => Route::InstalledBase(id),
        ["configData"] => Route::ConfigData,
        ["softwaremodules", sm, "artifacts", file] => {
            let name = decode(file);
            // `{fileName}.MD5SUM` is the more specific mapping
            // (`DdiRootControllerRestApi.downloadArtifactMd5`).
            match name.strip_suffix(".MD5SUM") {
                Some(base) => Route::Md5Sum(sm, base.to_string()),
                None => Route::Artifact(sm, name),
            }
        }
        _ => Route::Unknown,
    }
}

fn decode(segment: &str) -> String {
    percent_decode(segment)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_else(|| segment.to_string())
}

/// A numeric id of a path (`@PathVariable Long`): not a number is `400`.
fn path_id(s: &str) -> Result<u64, Response> {
    s.parse::<i64>()
        .ok()
        .and_then(|n| u64::try_from(n).ok())
        .ok_or_else(|| Response::new(400))
}

fn ddi(st: &mut State, urls: &Urls, origin: Origin, req: &Request, body: &[u8]) -> Reply {
    // The scheme, host and port the request came in on: where hawkBit's
    // default links point (`{protocolRequest}://{hostnameRequest}:{portRequest}`).
    let here = match origin {
        Origin::Http => urls.http.as_str(),
        _ => urls.ddi.as_str(),
    };
    let path = path_of(&req.target);
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    // The security chain covers `/{tenant}/controller/v1/**`
    // (`ControllerSecurityConfiguration`); anything else is not DDI.
    if segments.len() < 3 || segments[1] != "controller" || segments[2] != "v1" {
        return Reply::plain(Response::new(404));
    }
    let tenant = decode(segments[0]);
    let controller = segments.get(3).map(|s| decode(s)).unwrap_or_default();
    if !authenticated(st, urls, req, &tenant, &controller) {
        return Reply::plain(Response::new(401));
    }
    let rest = &segments[4..];
    match route(rest) {
        Route::Base => Reply::plain(base(st, urls, req, &controller)),
        Route::DeploymentBase(id) => {
            Reply::plain(deployment_base(st, urls, here, req, &controller, id))
        }
        Route::DeploymentFeedback(id) => Reply::plain(feedback(
            st,
            req,
            body,
            &controller,
            id,
            Channel::Deployment,
        )),
        Route::CancelAction(id) => Reply::plain(cancel_action(st, req, &controller, id)),
        Route::CancelFeedback(id) => {
            Reply::plain(feedback(st, req, body, &controller, id, Channel::Cancel))
        }
        Route::InstalledBase(id) => {
            Reply::plain(installed_base(st, urls, here, req, &controller, id))
        }
        Route::ConfigData => Reply::plain(config_data(st, req, body, &controller)),
        Route::Artifact(sm, file) => artifact(st, req, &controller, sm, &file, false),
        Route::Md5Sum(sm, file) => artifact(st, req, &controller, sm, &file, true),
        Route::Unknown => Reply::plain(Response::new(404)),
    }
}

/// The authentication filters (`SecurityTokenAuthenticator`,
/// `GatewayTokenAuthenticator`): the `Authorization` header (looked up
/// without regard to case) must start with `TargetToken ` or
/// `GatewayToken `, case and the one space included, and the rest must
/// equal the token exactly. A target token is the one of the controller
/// in the path, which must exist. The tenant of the path must be ours.
fn authenticated(st: &State, urls: &Urls, req: &Request, tenant: &str, controller: &str) -> bool {
    if tenant != urls.tenant || controller.is_empty() {
        return false;
    }
    let header = req.header("authorization");
    let target = || {
        header
            .and_then(|h| h.strip_prefix("TargetToken "))
            .is_some_and(|t| {
                st.controllers
                    .get(controller)
                    .and_then(|c| c.token.as_deref())
                    == Some(t)
            })
    };
    let gateway = |g: &str| header.and_then(|h| h.strip_prefix("GatewayToken ")) == Some(g);
    match &st.auth {
        Auth::None => true,
        Auth::TargetToken => target(),
        Auth::GatewayToken(g) => gateway(g),
        Auth::TargetOrGatewayToken(g) => target() || gateway(g),
    }
}

/// `GET /{tenant}/controller/v1/{controllerId}`
/// (`DdiRootController.getControllerBase`, `DataConversionHelper.fromTarget`).
fn base(st: &mut State, urls: &Urls, req: &Request, controller: &str) -> Response {
    if req.method != "GET" && req.method != "HEAD" {
        return method_not_allowed("GET");
    }
    let Some(media) = negotiate(req) else {
        return Response::new(406);
    };
    // `findOrRegisterTargetIfItDoesNotExist`: a poll registers the target.
    st.controllers.entry(controller.to_string()).or_default();
    let c = &st.controllers[controller];
    let url = urls.controller(&urls.ddi, controller);
    let mut links = Vec::new();
    if let Some(a) = st.active_action(controller) {
        if a.status.canceling_or_canceled() {
            // No `?c=` on the cancel link.
            links.push((
                "cancelAction",
                href(&format!("{url}/cancelAction/{}", a.id)),
            ));
        } else {
            links.push((
                "deploymentBase",
                href(&format!(
                    "{url}/deploymentBase/{}?c={}",
                    a.id,
                    a.etag_hash()
                )),
            ));
        }
    }
    // The last action closed FINISHED (`findInstalledActionByTarget`).
    if let Some(id) = c
        .installed
        .filter(|id| st.actions.get(id).is_some_and(|a| !a.active))
    {
        links.push(("installedBase", href(&format!("{url}/installedBase/{id}"))));
    }
    if c.request_attributes {
        links.push(("configData", href(&format!("{url}/configData"))));
    }
    let mut doc = vec![(
        "config",
        Json::obj(vec![(
            "polling",
            Json::obj(vec![("sleep", Json::str(&st.sleep))]),
        )]),
    )];
    // Spring HATEOAS writes no `_links` when there are none.
    if !links.is_empty() {
        doc.push(("_links", Json::obj(links)));
    }
    json_answer(req, media, Json::obj(doc).render())
}

fn href(url: &str) -> Json {
    Json::obj(vec![("href", Json::str(url))])
}

/// The action `id` of `controller` (`getTargetActionByIdOrThrow`: unknown,
/// or another target's, is `404`), after the target itself
/// (`findTargetOrThrow`: `404`).
fn target_action<'s>(
    st: &'s mut State,
    controller: &str,
    id: &str,
) -> Result<&'s mut ActionState, Response> {
    if !st.controllers.contains_key(controller) {
        return Err(not_found(&format!("Target {controller}")));
    }
    let id = path_id(id)?;
    st.actions
        .get_mut(&id)
        .filter(|a| a.controller == controller)
        .ok_or_else(|| not_found(&format!("Action {id}")))
}

/// `registerRetrieved`: a RETRIEVED entry unless the last one is one; the
/// action goes RETRIEVED unless it is canceling (no quota check: the entry
/// is saved directly).
fn register_retrieved(a: &mut ActionState, message: &str) {
    if a.history.last().map(|e| e.status) != Some(EntryStatus::Retrieved) {
        a.history.push(StatusEntry {
            status: EntryStatus::Retrieved,
            messages: vec![format!("{SERVER_MESSAGE_PREFIX}{message}")],
            by_device: false,
            timestamp_ms: now_ms(),
        });
        if !a.status.canceling_or_canceled() {
            a.status = ActionStatus::Retrieved;
        }
    }
}

/// The `c` and `actionHistory` query parameters (`int` and `Integer`: not a
/// number is `400`); returns the history count (default 0).
fn deployment_query(req: &Request, with_c: bool) -> Result<i64, Response> {
    let mut count = 0i64;
    for pair in query_of(&req.target).unwrap_or("").split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = decode(v);
        match k {
            "c" if with_c => {
                v.trim().parse::<i32>().map_err(|_| Response::new(400))?;
            }
            "actionHistory" => {
                count = v.trim().parse::<i32>().map_err(|_| Response::new(400))? as i64;
            }
            _ => {}
        }
    }
    Ok(count)
}

/// `GET …/deploymentBase/{actionId}` (`getControllerDeploymentBaseAction`):
/// any action of the target that is not canceling or canceled, closed ones
/// too; `404` otherwise.
fn deployment_base(
    st: &mut State,
    urls: &Urls,
    here: &str,
    req: &Request,
    controller: &str,
    id: &str,
) -> Response {
    if req.method != "GET" && req.method != "HEAD" {
        return method_not_allowed("GET");
    }
    let Some(media) = negotiate(req) else {
        return Response::new(406);
    };
    let count = match deployment_query(req, true) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let a = match target_action(st, controller, id) {
        Ok(a) => a,
        Err(r) => return r,
    };
    if a.status.canceling_or_canceled() {
        return Response::new(404);
    }
    let id = a.id;
    // The document first, the retrieval after it (so `actionHistory.status`
    // is the status before this request).
    let doc = deployment_document(st, urls, here, &st.actions[&id], count).render();
    if let Some(a) = st.actions.get_mut(&id).filter(|a| a.active) {
        register_retrieved(
            a,
            "Target retrieved update action and should start now the download.",
        );
    }
    json_answer(req, media, doc)
}

/// `GET …/installedBase/{actionId}` (`getControllerInstalledAction`):
/// `404` for an active or canceling/canceled action.
fn installed_base(
    st: &mut State,
    urls: &Urls,
    here: &str,
    req: &Request,
    controller: &str,
    id: &str,
) -> Response {
    if req.method != "GET" && req.method != "HEAD" {
        return method_not_allowed("GET");
    }
    let Some(media) = negotiate(req) else {
        return Response::new(406);
    };
    let count = match deployment_query(req, false) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let a = match target_action(st, controller, id) {
        Ok(a) => a,
        Err(r) => return r,
    };
    if a.active || a.status.canceling_or_canceled() {
        return Response::new(404);
    }
    let id = a.id;
    json_answer(
        req,
        media,
        deployment_document(st, urls, here, &st.actions[&id], count).render(),
    )
}

/// The `DdiDeploymentBase` document, fields in the documented order
/// (`@JsonPropertyOrder({"id", "deployment", "actionHistory"})` and the
/// example of `DdiDeploymentBase.java`).
fn deployment_document(st: &State, urls: &Urls, here: &str, a: &ActionState, history: i64) -> Json {
    let (download, update) = a.handling();
    let mut deployment = vec![
        ("download", Json::str(download.as_str())),
        ("update", Json::str(update.as_str())),
    ];
    if let Some(w) = a.window {
        deployment.push(("maintenanceWindow", Json::str(w.as_str())));
    }
    let chunks = a
        .modules
        .iter()
        .filter_map(|id| st.modules.get(id))
        .map(|m| chunk_document(urls, st.links, here, &a.controller, m))
        .collect();
    deployment.push(("chunks", Json::Arr(chunks)));
    let mut doc = vec![
        ("id", Json::str(&a.id.to_string())),
        ("deployment", Json::obj(deployment)),
    ];
    // `generateDdiActionHistory`: the device's messages (the server's are
    // left out), newest first, at most MAX_ACTION_HISTORY; none for 0.
    if history != 0 {
        let limit = if history < 0 || history as usize >= MAX_ACTION_HISTORY {
            MAX_ACTION_HISTORY
        } else {
            history as usize
        };
        let mut entries: Vec<(i64, usize, &str)> = Vec::new();
        for (i, e) in a.history.iter().enumerate() {
            for m in &e.messages {
                if !m.starts_with(SERVER_MESSAGE_PREFIX) {
                    entries.push((e.timestamp_ms, i, m));
                }
            }
        }
        entries.sort_by_key(|e| std::cmp::Reverse((e.0, e.1)));
        let messages: Vec<Json> = entries
            .into_iter()
            .take(limit)
            .map(|(_, _, m)| Json::str(m))
            .collect();
        if !messages.is_empty() {
            doc.push((
                "actionHistory",
                Json::obj(vec![
                    ("status", Json::str(a.status.name())),
                    ("messages", Json::Arr(messages)),
                ]),
            ));
        }
    }
    Json::obj(doc)
}

/// One `DdiChunk` (`DataConversionHelper.createChunks`): part, version,
/// name, artifacts, and metadata when there is some.
fn chunk_document(urls: &Urls, links: Links, here: &str, controller: &str, m: &Module) -> Json {
    let artifacts = m
        .artifacts
        .iter()
        .map(|f| {
            let file = percent_encode(&f.filename);
            // hawkBit's link pattern (`hawkbit-artifactdl-defaults.properties`:
            // `…/{tenant}/controller/v1/{controllerId}/softwaremodules/{softwareModuleId}/artifacts/{artifactFileName}`).
            let ddi = |base: &str| {
                format!(
                    "{}/softwaremodules/{}/artifacts/{file}",
                    urls.controller(base, controller),
                    m.id
                )
            };
            let links = match links {
                Links::Documented => {
                    let https = match f.origin {
                        Origin::Cdn => format!(
                            "{}/api/v1/{}/download/controller/{}/softwaremodules/{}/filename/{file}",
                            urls.cdn,
                            urls.tenant,
                            percent_encode(controller),
                            m.id
                        ),
                        _ => ddi(&urls.ddi),
                    };
                    let http = ddi(&urls.http);
                    vec![
                        ("download", href(&https)),
                        ("download-http", href(&http)),
                        ("md5sum-http", href(&format!("{http}.MD5SUM"))),
                        ("md5sum", href(&format!("{https}.MD5SUM"))),
                    ]
                }
                // The only two rels hawkBit configures by default, at the
                // scheme, host and port of the request.
                Links::HawkbitDefaults => {
                    let url = ddi(here);
                    vec![
                        ("download-http", href(&url)),
                        ("md5sum-http", href(&format!("{url}.MD5SUM"))),
                    ]
                }
            };
            Json::obj(vec![
                ("filename", Json::str(&f.filename)),
                (
                    "hashes",
                    Json::obj(vec![
                        ("sha1", Json::str(&f.sha1)),
                        ("md5", Json::str(&f.md5)),
                        ("sha256", Json::str(&f.sha256)),
                    ]),
                ),
                ("size", Json::Int(f.size as i64)),
                ("_links", Json::obj(links)),
            ])
        })
        .collect();
    let mut doc = vec![
        ("part", Json::str(&m.part)),
        ("version", Json::str(&m.version)),
        ("name", Json::str(&m.name)),
        ("artifacts", Json::Arr(artifacts)),
    ];
    if !m.metadata.is_empty() {
        doc.push((
            "metadata",
            Json::Arr(
                m.metadata
                    .iter()
                    .map(|(k, v)| Json::obj(vec![("key", Json::str(k)), ("value", Json::str(v))]))
                    .collect(),
            ),
        ));
    }
    Json::obj(doc)
}

/// `GET …/cancelAction/{actionId}` (`getControllerCancelAction`): for a
/// canceling or canceled action, `{"id": id, "cancelAction": {"stopId": id}}`;
/// `404` otherwise.
fn cancel_action(st: &mut State, req: &Request, controller: &str, id: &str) -> Response {
    if req.method != "GET" && req.method != "HEAD" {
        return method_not_allowed("GET");
    }
    let Some(media) = negotiate(req) else {
        return Response::new(406);
    };
    let a = match target_action(st, controller, id) {
        Ok(a) => a,
        Err(r) => return r,
    };
    if !a.status.canceling_or_canceled() {
        return Response::new(404);
    }
    register_retrieved(
        a,
        "Target retrieved cancel action and should start now the cancellation.",
    );
    let id = a.id.to_string();
    let doc = Json::obj(vec![
        ("id", Json::str(&id)),
        ("cancelAction", Json::obj(vec![("stopId", Json::str(&id))])),
    ]);
    json_answer(req, media, doc.render())
}

/// `POST …/deploymentBase/{id}/feedback` and `…/cancelAction/{id}/feedback`.
fn feedback(
    st: &mut State,
    req: &Request,
    body: &[u8],
    controller: &str,
    id: &str,
    channel: Channel,
) -> Response {
    if req.method != "POST" {
        return method_not_allowed("POST");
    }
    if !json_body(req) {
        return Response::new(415);
    }
    let line = format!("{} {}", req.method, path_of(&req.target));
    let checked = check_feedback(body, &line);
    let seq = st.next_feedback_seq();
    let mut record = Feedback {
        seq,
        controller: controller.to_string(),
        action: id.to_string(),
        action_id: path_id(id).ok(),
        channel,
        status: 0,
        execution: checked.execution,
        finished: checked.finished,
        progress: checked.progress,
        code: checked.code,
        details: checked.details.clone(),
        timestamp: checked.timestamp,
        ignored_fields: checked.ignored.clone(),
        violations: checked.violations.clone(),
        body: body.to_vec(),
    };
    let response = if checked.violations.iter().any(|v| v.refused) {
        not_readable()
    } else {
        let (execution, finished) = match (checked.execution, checked.finished) {
            (Some(e), Some(f)) => (e, f),
            // A body with neither refused nor complete cannot happen:
            // both are required and their absence is refused.
            _ => (Execution::Proceeding, Finished::None),
        };
        let quotas = (st.status_quota, st.message_quota);
        match target_action(st, controller, id) {
            Err(r) => r,
            Ok(a) => match channel {
                Channel::Deployment => {
                    deployment_feedback(a, execution, finished, &checked, quotas)
                }
                Channel::Cancel => cancel_feedback(a, execution, finished, &checked, quotas),
            },
        }
    };
    if response.status == 200 {
        apply_closing(st, id);
    }
    record.status = response.status;
    st.violations.extend(record.violations.iter().cloned());
    st.feedback.push(record);
    response
}

/// After an accepted feedback closed an action: the target side effects
/// (`JpaControllerManagement.onActionStatusUpdate`): a FINISHED action is
/// the installed one when its timestamp is newer than the installation
/// date (`handleFinishedAndStoreInTargetStatus`) and asks for the
/// attributes again, as a DOWNLOADED download-only action does.
fn apply_closing(st: &mut State, id: &str) {
    let Ok(id) = path_id(id) else { return };
    let Some(a) = st.actions.get(&id) else { return };
    if a.active {
        return;
    }
    let last = a.history.last().cloned();
    let (status, controller) = (a.status, a.controller.clone());
    let Some(last) = last else { return };
    let Some(c) = st.controllers.get_mut(&controller) else {
        return;
    };
    match (status, last.status) {
        (ActionStatus::Finished, EntryStatus::Finished) => {
            if c.installation_date.is_none_or(|d| d < last.timestamp_ms) {
                c.installed = Some(id);
                c.installation_date = Some(last.timestamp_ms);
            }
            c.request_attributes = true;
        }
        (ActionStatus::Downloaded, EntryStatus::Downloaded) => {
            c.request_attributes = true;
        }
        _ => {}
    }
}

/// The messages a device feedback stores: details (each cut into
/// [`MESSAGE_ENTRY_LENGTH`] pieces by `JpaActionStatus.addMessage`) and
/// `Device reported status code: N`.
fn device_messages(checked: &Checked) -> Vec<String> {
    let mut out = Vec::new();
    for d in &checked.details {
        out.extend(split_message(d));
    }
    if let Some(code) = checked.code {
        out.push(format!("Device reported status code: {code}"));
    }
    out
}

/// `JpaActionStatus.addMessage`: pieces of at most
/// [`MESSAGE_ENTRY_LENGTH`] UTF-16 code units.
fn split_message(m: &str) -> Vec<String> {
    let units: Vec<u16> = m.encode_utf16().collect();
    if units.len() <= MESSAGE_ENTRY_LENGTH {
        return vec![m.to_string()];
    }
    units
        .chunks(MESSAGE_ENTRY_LENGTH)
        .map(String::from_utf16_lossy)
        .collect()
}

/// A deployment feedback on `a` (`postDeploymentBaseActionFeedback`,
/// `generateUpdateStatus`, `JpaActionManagement.addActionStatus`).
fn deployment_feedback(
    a: &mut ActionState,
    execution: Execution,
    finished: Finished,
    checked: &Checked,
    (status_quota, message_quota): (usize, usize),
) -> Response {
    // A closed action takes no feedback: `410 Gone` ("Action is not active
    // anymore", DdiRootControllerRestApi), empty body.
    if !a.active {
        return Response::new(410);
    }
    let mut messages = device_messages(checked);
    let (status, server_message) = match execution {
        Execution::Canceled => (EntryStatus::Canceled, "Target confirmed cancellation."),
        Execution::Rejected => (EntryStatus::Warning, "Target REJECTED update"),
        Execution::Closed if finished == Finished::Failure => {
            (EntryStatus::Error, "Target reported CLOSED with ERROR!")
        }
        // `none` is handled like `success` (direct-device-integration-api.md).
        Execution::Closed => (EntryStatus::Finished, "Target reported CLOSED with OK!"),
        Execution::Download => (EntryStatus::Download, "Target confirmed download start"),
        Execution::Downloaded => (
            EntryStatus::Downloaded,
            "Target confirmed download finished",
        ),
        _ => (EntryStatus::Running, ""),
    };
    if messages.is_empty() {
        messages.push(if server_message.is_empty() {
            format!(
                "{SERVER_MESSAGE_PREFIX}Target reported {}.",
                execution.as_str()
            )
        } else {
            format!("{SERVER_MESSAGE_PREFIX}{server_message}.")
        });
    }
    // The status quota (intermediate statuses only), then the message
    // quota (`handleAddUpdateActionStatus`); both `429`.
    if !a.quota_allows(status, status_quota) {
        return quota_exceeded(&format!(
            "Request contains too many entries of {{ActionStatus}}. {{1}} is beyond the permitted {{{status_quota}}}."
        ));
    }
    if messages.len() > message_quota {
        return quota_exceeded(&format!(
            "Request contains too many entries of {{Message}}. {{{}}} is beyond the permitted {{{message_quota}}}.",
            messages.len()
        ));
    }
    a.history.push(StatusEntry {
        status,
        messages,
        by_device: true,
        timestamp_ms: checked.timestamp.unwrap_or_else(now_ms),
    });
    match status {
        // `handleErrorOnAction`.
        EntryStatus::Error => {
            a.active = false;
            a.status = ActionStatus::Error;
        }
        // `handleFinishedAndStoreInTargetStatus`.
        EntryStatus::Finished => {
            a.active = false;
            a.status = ActionStatus::Finished;
        }
        // `handleDownloadedActionStatus`: only a download-only action is
        // closed by `downloaded`.
        EntryStatus::Downloaded if a.action_type == ActionType::DownloadOnly => {
            a.active = false;
            a.status = ActionStatus::Downloaded;
        }
        // CANCELED, WARNING, DOWNLOAD, RUNNING leave the action as it is.
        _ => {}
    }
    Response::new(200)
}

/// A cancel feedback on `a` (`postCancelActionFeedback`,
/// `generateActionCancelStatus`, `JpaControllerManagement.addCancelActionStatus`).
fn cancel_feedback(
    a: &mut ActionState,
    execution: Execution,
    finished: Finished,
    checked: &Checked,
    (status_quota, message_quota): (usize, usize),
) -> Response {
    // Only a canceling or canceled action takes cancel feedback:
    // `CancelActionNotAllowedException` → `405`.
    if !a.status.canceling_or_canceled() {
        return exception(
            405,
            "org.eclipse.hawkbit.repository.exception.CancelActionNotAllowedException",
            "hawkbit.server.error.action.notCancelable",
            "The action is not in canceling state.",
        );
    }
    // The server's message comes first here, before the details; for
    // `closed` the list is still empty, so it is always added.
    let (status, mut messages) = match execution {
        Execution::Canceled => (
            EntryStatus::Warning,
            vec![format!(
                "{SERVER_MESSAGE_PREFIX}Target reported cancel for a cancel which is not supported by the server."
            )],
        ),
        Execution::Rejected => (
            EntryStatus::CancelRejected,
            vec![format!(
                "{SERVER_MESSAGE_PREFIX}Target rejected the cancellation request."
            )],
        ),
        Execution::Closed if finished == Finished::Failure => (
            EntryStatus::Error,
            vec![format!(
                "{SERVER_MESSAGE_PREFIX}Target was not able to complete cancellation."
            )],
        ),
        Execution::Closed => (
            EntryStatus::Canceled,
            vec![format!("{SERVER_MESSAGE_PREFIX}Cancellation confirmed.")],
        ),
        _ => (EntryStatus::Running, Vec::new()),
    };
    messages.extend(device_messages(checked));
    match status {
        // `handleFinishedCancelation` → `DeploymentHelper.successCancellation`:
        // the action is closed CANCELED.
        EntryStatus::Canceled => {
            messages.push(format!(
                "{SERVER_MESSAGE_PREFIX}Cancellation completion is finished successfully."
            ));
            a.active = false;
            a.status = ActionStatus::Canceled;
        }
        // "Cancellation rejected. Back to running."
        EntryStatus::Error | EntryStatus::CancelRejected => {
            a.status = ActionStatus::Running;
        }
        // Anything else is informational and the quotas apply.
        _ => {
            if !a.quota_allows(status, status_quota) {
                return quota_exceeded(&format!(
                    "Request contains too many entries of {{ActionStatus}}. {{1}} is beyond the permitted {{{status_quota}}}."
                ));
            }
            if messages.len() > message_quota {
                return quota_exceeded(&format!(
                    "Request contains too many entries of {{Message}}. {{{}}} is beyond the permitted {{{message_quota}}}.",
                    messages.len()
                ));
            }
        }
    }
    a.history.push(StatusEntry {
        status,
        messages,
        by_device: true,
        timestamp_ms: checked.timestamp.unwrap_or_else(now_ms),
    });
    Response::new(200)
}

/// `PUT …/configData` (`putConfigData`,
/// `JpaControllerManagement.updateControllerAttributes`).
fn config_data(st: &mut State, req: &Request, body: &[u8], controller: &str) -> Response {
    if req.method != "PUT" {
        return method_not_allowed("PUT");
    }
    if !json_body(req) {
        return Response::new(415);
    }
    let line = format!("{} {}", req.method, path_of(&req.target));
    let checked = check_config_data(body, &line);
    let seq = st.config_puts.len();
    let mut record = ConfigDataPut {
        seq,
        controller: controller.to_string(),
        status: 0,
        mode: checked.mode.clone(),
        data: checked.data.clone(),
        ignored_fields: checked.ignored.clone(),
        violations: Vec::new(),
        body: body.to_vec(),
    };
    let response = if checked.violations.iter().any(|v| v.refused && !v.attribute) {
        not_readable()
    } else if checked.violations.iter().any(|v| v.refused) {
        // Keys and values are checked before the target is looked up:
        // `InvalidTargetAttributeException` → `400`.
        exception(
            400,
            "org.eclipse.hawkbit.repository.exception.InvalidTargetAttributeException",
            "hawkbit.server.error.repo.invalidTargetAttributes",
            "The given target attributes are invalid",
        )
    } else if let Some(c) = st.controllers.get_mut(controller) {
        let before = c.attributes.len();
        let mut result = match checked.mode.as_deref() {
            Some("replace") => BTreeMap::new(),
            _ => c.attributes.clone(),
        };
        for (k, v) in &checked.data {
            match (checked.mode.as_deref(), v) {
                (Some("remove"), _) | (_, None) => {
                    result.remove(k);
                }
                (_, Some(v)) => {
                    result.insert(k.clone(), v.clone());
                }
            }
        }
        // `assertTargetAttributesQuota`, only when the map grew.
        if result.len() > before && st.attribute_quota > 0 && result.len() > st.attribute_quota {
            quota_exceeded(&format!(
                "Request contains too many entries of {{Attribute}}. {{{}}} is beyond the permitted {{{}}}.",
                result.len(),
                st.attribute_quota
            ))
        } else {
            c.attributes = result;
            c.request_attributes = false;
            Response::new(200)
        }
    } else {
        not_found(&format!("Target {controller}"))
    };
    record.status = response.status;
    record.violations = checked
        .violations
        .into_iter()
        .map(|v| v.violation)
        .collect();
    st.violations.extend(record.violations.iter().cloned());
    st.config_puts.push(record);
    response
}

/// An artifact or its `.MD5SUM` from the DDI API
/// (`DdiRootController.downloadArtifact`, `downloadArtifactMd5`), on the
/// DDI or the plain-HTTP listener.
fn artifact(
    st: &mut State,
    req: &Request,
    controller: &str,
    sm: &str,
    filename: &str,
    md5sum: bool,
) -> Reply {
    if req.method != "GET" && req.method != "HEAD" {
        return Reply::plain(method_not_allowed("GET"));
    }
    if !st.controllers.contains_key(controller) {
        return Reply::plain(not_found(&format!("Target {controller}")));
    }
    let sm = match path_id(sm) {
        Ok(id) => id,
        Err(r) => return Reply::plain(r),
    };
    let Some(file) = st
        .modules
        .get(&sm)
        .and_then(|m| m.artifacts.iter().find(|f| f.filename == filename))
        .cloned()
    else {
        return Reply::plain(Response::new(404));
    };
    let etag = format!("\"{}\"", file.sha1);
    if !md5sum {
        if let Some(im) = req.header("if-match") {
            let matches = im.split(',').any(|t| {
                let t = t.trim().trim_start_matches("W/").trim_matches('"');
                t == "*" || t == file.sha1
            });
            if !matches {
                return Reply::plain(Response::new(412));
            }
        }
    }
    // The module must belong to an active action of the target that is
    // not canceling (`getActionForDownloadByTargetAndSoftwareModule`:
    // `SoftwareModuleNotAssignedToTargetException`, a `404`).
    let Some(action) = st.actions.values_mut().find(|a| {
        a.controller == controller
            && a.active
            && !a.status.canceling_or_canceled()
            && a.modules.contains(&sm)
    }) else {
        return Reply::plain(not_found(&format!("Software module {sm} for {controller}")));
    };
    // A download without `Range` is logged as a DOWNLOAD entry, under the
    // status quota (`logDownload` → `addInformationalActionStatus`).
    let range_header = (req.method == "GET").then(|| req.header("range")).flatten();
    if range_header.is_none() || md5sum {
        if !action.quota_allows(EntryStatus::Download, st.status_quota) {
            return Reply::plain(quota_exceeded("Too many entries of {ActionStatus}."));
        }
        action.history.push(StatusEntry {
            status: EntryStatus::Download,
            messages: vec![format!(
                "{SERVER_MESSAGE_PREFIX}Target downloads {}",
                path_of(&req.target)
            )],
            by_device: false,
            timestamp_ms: now_ms(),
        });
    }
    if md5sum {
        return md5sum_answer(&file);
    }
    let response = file_answer(&file, &etag, req, range_header, hawkbit_ranges);
    Reply {
        response,
        file: Some(file.filename),
    }
}

/// `writeMD5FileResponse`: `<md5>  <filename>`, `text/plain`.
fn md5sum_answer(file: &ArtifactFile) -> Reply {
    let body = format!("{}  {}", file.md5, file.filename);
    Reply::plain(
        Response::bytes(200, "text/plain", body.into_bytes()).header(
            "Content-Disposition",
            format!("attachment;filename={}.MD5SUM", file.filename),
        ),
    )
}

/// A file answer (`FileStreamingUtil.writeFileResponse`): `ETag` is the
/// quoted SHA-1, `Accept-Ranges: bytes`, `application/octet-stream`; a
/// `Range` is honoured unless an `If-Range` differs from the ETag.
fn file_answer(
    file: &ArtifactFile,
    etag: &str,
    req: &Request,
    range_header: Option<&str>,
    ranges: fn(&str, u64) -> Range,
) -> Response {
    let f = match File::open(&file.path) {
        Ok(f) => f,
        Err(_) => return Response::new(500),
    };
    let len = file.size;
    let mut range = range_header.map_or(Range::Full, |h| ranges(h, len));
    if req.header("if-range").is_some_and(|v| v != etag) {
        range = Range::Full;
    }
    let base = |status: u16| {
        let mut r = Response::new(status)
            .header(
                "Content-Disposition",
                format!("attachment;filename={}", file.filename),
            )
            .header("ETag", etag.to_string())
            .header("Accept-Ranges", "bytes")
            .header("Content-Type", "application/octet-stream")
            .header("X-Content-Type-Options", "nosniff");
        if let Ok(m) = std::fs::metadata(&file.path).and_then(|m| m.modified()) {
            r = r.header("Last-Modified", http_date(m));
        }
        r
    };
    match range {
        Range::Full => {
            let mut r = base(200);
            r.length = Some(len);
            r.body = Body::File {
                file: f,
                start: 0,
                len,
            };
            r
        }
        Range::Part { start, end } => {
            let n = end - start + 1;
            let mut r = base(206).header("Content-Range", format!("bytes {start}-{end}/{len}"));
            r.length = Some(n);
            r.body = Body::File {
                file: f,
                start,
                len: n,
            };
            r
        }
        Range::Unsatisfiable => {
            Response::new(416).header("Content-Range", format!("bytes */{len}"))
        }
    }
}

/// A `Range` header as hawkBit reads it (`FileStreamingUtil.Range.of`):
/// it must match `bytes=\d*-\d*(,\d*-\d*)*` exactly (unit in lower case,
/// no spaces), `-n` is the last n bytes, an end past the file is clipped,
/// and a start after the end (a start at or past the end of the file, an
/// empty or unparsable number) is `416`. Several ranges are answered with
/// the whole file here (hawkBit writes `multipart/byteranges`).
pub fn hawkbit_ranges(header: &str, len: u64) -> Range {
    let Some(spec) = header.strip_prefix("bytes=") else {
        return Range::Unsatisfiable;
    };
    let well_formed = spec.split(',').all(|p| {
        p.split_once('-').is_some_and(|(a, b)| {
            a.bytes().all(|c| c.is_ascii_digit()) && b.bytes().all(|c| c.is_ascii_digit())
        })
    });
    if !well_formed {
        return Range::Unsatisfiable;
    }
    let mut parts = Vec::new();
    for p in spec.split(',') {
        let (a, b) = p.split_once('-').unwrap_or((p, ""));
        let (start, end) = if a.is_empty() {
            let Ok(n) = b.parse::<u64>() else {
                return Range::Unsatisfiable;
            };
            // hawkBit computes `length - n`; below 0 is clipped here.
            (len.saturating_sub(n) as i128, len as i128 - 1)
        } else {
            let Ok(s) = a.parse::<u64>() else {
                return Range::Unsatisfiable;
            };
            let end = if b.is_empty() {
                len as i128 - 1
            } else {
                match b.parse::<u64>() {
                    Ok(e) => (e as i128).min(len as i128 - 1),
                    Err(_) => return Range::Unsatisfiable,
                }
            };
            (s as i128, end)
        };
        if start > end {
            return Range::Unsatisfiable;
        }
        parts.push((start as u64, end as u64));
    }
    parts.sort();
    if parts.windows(2).any(|w| w[1].0 <= w[0].1) {
        return Range::Unsatisfiable;
    }
    match parts.as_slice() {
        [(start, end)] => Range::Part {
            start: *start,
            end: *end,
        },
        _ => Range::Full,
    }
}

/// The [`Origin::Cdn`] listener: artifacts under
/// `/api/v1/{tenant}/download/controller/{id}/softwaremodules/{id}/filename/{file}`
/// (and `.MD5SUM`), with no credentials asked and RFC 9110 single ranges.
fn cdn(st: &mut State, urls: &Urls, req: &Request) -> Reply {
    let path = path_of(&req.target);
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    let (tenant, sm, file) = match segments.as_slice() {
        [
            "api",
            "v1",
            tenant,
            "download",
            "controller",
            _,
            "softwaremodules",
            sm,
            "filename",
            file,
        ] => (decode(tenant), *sm, decode(file)),
        _ => return Reply::plain(Response::new(404)),
    };
    if req.method != "GET" && req.method != "HEAD" {
        return Reply::plain(method_not_allowed("GET"));
    }
    let (name, md5sum) = match file.strip_suffix(".MD5SUM") {
        Some(n) => (n.to_string(), true),
        None => (file.clone(), false),
    };
    let Some(f) = sm
        .parse::<u64>()
        .ok()
        .filter(|_| tenant == urls.tenant)
        .and_then(|sm| st.modules.get(&sm))
        .and_then(|m| m.artifacts.iter().find(|f| f.filename == name))
        .cloned()
    else {
        return Reply::plain(Response::new(404));
    };
    if md5sum {
        return md5sum_answer(&f);
    }
    let etag = format!("\"{}\"", f.sha1);
    let range_header = (req.method == "GET").then(|| req.header("range")).flatten();
    Reply {
        response: file_answer(&f, &etag, req, range_header, parse_range),
        file: Some(f.filename),
    }
}

// ---------------------------------------------------------------------------
// Checking the bodies.

/// A feedback body, read field by field.
#[derive(Default)]
struct Checked {
    execution: Option<Execution>,
    finished: Option<Finished>,
    progress: Option<Progress>,
    code: Option<i64>,
    details: Vec<String>,
    timestamp: Option<i64>,
    ignored: Vec<String>,
    violations: Vec<Violation>,
}

const SRC_FEEDBACK: &str = "DdiActionFeedback.java";
const SRC_STATUS: &str = "DdiStatus.java";
const SRC_RESULT: &str = "DdiResult.java";
const SRC_PROGRESS: &str = "DdiProgress.java";
const SRC_JACKSON: &str = "hawkbit-jackson-defaults.properties";
const SRC_MESSAGES: &str = "JpaActionStatus.java";
const SRC_CONFIG: &str = "DdiConfigData.java";
const SRC_ATTRIBUTES: &str = "JpaControllerManagement.java";

struct Checker<'a> {
    request: &'a str,
    violations: Vec<Violation>,
    ignored: Vec<String>,
}

impl Checker<'_> {
    fn flag(
        &mut self,
        field: &str,
        problem: impl Into<String>,
        refused: bool,
        source: &'static str,
    ) {
        self.violations.push(Violation {
            request: self.request.to_string(),
            field: field.to_string(),
            problem: problem.into(),
            refused,
            source,
        });
    }

    /// Record the members of `o` other than `known` as ignored (every DDI
    /// model has `@JsonIgnoreProperties(ignoreUnknown = true)`).
    fn unknown(&mut self, at: &str, o: &serde_json::Map<String, Value>, known: &[&str]) {
        for k in o.keys().filter(|k| !known.contains(&k.as_str())) {
            self.ignored.push(if at.is_empty() {
                k.clone()
            } else {
                format!("{at}.{k}")
            });
        }
    }

    /// A JSON integer within `[min, max]`, or a refusal (`Long` and
    /// `Integer` fields: a value out of range does not bind; a string or a
    /// fraction is refused here whatever a coercion might do).
    fn integer(
        &mut self,
        field: &str,
        v: &Value,
        min: i64,
        max: i64,
        source: &'static str,
    ) -> Option<i64> {
        match v.as_i64() {
            Some(n) if (min..=max).contains(&n) => Some(n),
            Some(n) => {
                self.flag(field, format!("{n} is out of range"), true, source);
                None
            }
            None => {
                self.flag(field, format!("{v} is not an integer"), true, source);
                None
            }
        }
    }
}

/// Check a feedback body against `DdiActionFeedback` (as bound: Jackson
/// with `@Valid` from `DdiRootControllerRestApi`) and the published
/// schema (`ddi.html`).
fn check_feedback(body: &[u8], request: &str) -> Checked {
    let mut c = Checker {
        request,
        violations: Vec::new(),
        ignored: Vec::new(),
    };
    let mut out = Checked::default();
    let v: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            c.flag("$", format!("not JSON: {e}"), true, SRC_FEEDBACK);
            out.violations = c.violations;
            return out;
        }
    };
    let Some(root) = v.as_object() else {
        c.flag("$", "not a JSON object", true, SRC_FEEDBACK);
        out.violations = c.violations;
        return out;
    };
    c.unknown("", root, &["timestamp", "status"]);
    // `timestamp`: optional `Long`; absent or null is the server's clock.
    match root.get("timestamp") {
        None | Some(Value::Null) => {}
        Some(t) => out.timestamp = c.integer("timestamp", t, i64::MIN, i64::MAX, SRC_FEEDBACK),
    }
    // `status`: `@NotNull @Valid`, required.
    match root.get("status") {
        None | Some(Value::Null) => c.flag("status", "required, missing", true, SRC_FEEDBACK),
        Some(Value::Object(status)) => {
            c.unknown(
                "status",
                status,
                &["execution", "result", "code", "details"],
            );
            match status.get("execution") {
                None | Some(Value::Null) => {
                    c.flag("status.execution", "required, missing", true, SRC_STATUS)
                }
                Some(Value::String(s)) => match Execution::parse(s) {
                    Some(e) => out.execution = Some(e),
                    None => c.flag(
                        "status.execution",
                        format!(
                            "{s:?} is not one of {}",
                            Execution::ALL.map(Execution::as_str).join(", ")
                        ),
                        true,
                        SRC_STATUS,
                    ),
                },
                Some(other) => c.flag(
                    "status.execution",
                    format!("{other} is not a string"),
                    true,
                    SRC_STATUS,
                ),
            }
            match status.get("result") {
                None | Some(Value::Null) => {
                    c.flag("status.result", "required, missing", true, SRC_STATUS)
                }
                Some(Value::Object(result)) => {
                    c.unknown("status.result", result, &["finished", "progress"]);
                    match result.get("finished") {
                        None | Some(Value::Null) => c.flag(
                            "status.result.finished",
                            "required, missing",
                            true,
                            SRC_RESULT,
                        ),
                        Some(Value::String(s)) => match Finished::parse(s) {
                            Some(f) => out.finished = Some(f),
                            None => c.flag(
                                "status.result.finished",
                                format!("{s:?} is not one of success, failure, none"),
                                true,
                                SRC_RESULT,
                            ),
                        },
                        Some(other) => c.flag(
                            "status.result.finished",
                            format!("{other} is not a string"),
                            true,
                            SRC_RESULT,
                        ),
                    }
                    match result.get("progress") {
                        None | Some(Value::Null) => {}
                        Some(Value::Object(p)) => {
                            c.unknown("status.result.progress", p, &["cnt", "of"]);
                            let mut progress = Progress {
                                cnt: None,
                                of: None,
                            };
                            match p.get("cnt") {
                                // Documented as required (`@NotNull`,
                                // `ddi.html`), but `DdiResult.progress`
                                // has no `@Valid`: hawkBit takes it.
                                None | Some(Value::Null) => c.flag(
                                    "status.result.progress.cnt",
                                    "required by the schema, missing (hawkBit does not validate progress)",
                                    false,
                                    SRC_RESULT,
                                ),
                                Some(n) => {
                                    progress.cnt = c.integer(
                                        "status.result.progress.cnt",
                                        n,
                                        i32::MIN as i64,
                                        i32::MAX as i64,
                                        SRC_PROGRESS,
                                    )
                                }
                            }
                            match p.get("of") {
                                None | Some(Value::Null) => {}
                                Some(n) => {
                                    progress.of = c.integer(
                                        "status.result.progress.of",
                                        n,
                                        i32::MIN as i64,
                                        i32::MAX as i64,
                                        SRC_PROGRESS,
                                    )
                                }
                            }
                            out.progress = Some(progress);
                        }
                        Some(other) => c.flag(
                            "status.result.progress",
                            format!("{other} is not an object"),
                            true,
                            SRC_RESULT,
                        ),
                    }
                }
                Some(other) => c.flag(
                    "status.result",
                    format!("{other} is not an object"),
                    true,
                    SRC_STATUS,
                ),
            }
            match status.get("code") {
                None | Some(Value::Null) => {}
                Some(n) => {
                    out.code = c.integer(
                        "status.code",
                        n,
                        i32::MIN as i64,
                        i32::MAX as i64,
                        SRC_STATUS,
                    )
                }
            }
            match status.get("details") {
                None | Some(Value::Null) => {}
                // A single value for an array binds
                // (`accept-single-value-as-array=true`).
                Some(Value::String(s)) => {
                    c.flag(
                        "status.details",
                        "a string, documented as an array of strings (hawkBit takes it as one)",
                        false,
                        SRC_JACKSON,
                    );
                    out.details.push(s.clone());
                }
                Some(Value::Array(items)) => {
                    for (i, item) in items.iter().enumerate() {
                        match item {
                            Value::String(s) => out.details.push(s.clone()),
                            // `JpaActionStatus.addMessage` skips null.
                            Value::Null => c.flag(
                                &format!("status.details[{i}]"),
                                "null, documented as a string (hawkBit skips it)",
                                false,
                                SRC_MESSAGES,
                            ),
                            other => c.flag(
                                &format!("status.details[{i}]"),
                                format!("{other} is not a string"),
                                true,
                                SRC_STATUS,
                            ),
                        }
                    }
                }
                Some(other) => c.flag(
                    "status.details",
                    format!("{other} is not an array of strings"),
                    true,
                    SRC_STATUS,
                ),
            }
        }
        Some(other) => c.flag(
            "status",
            format!("{other} is not an object"),
            true,
            SRC_FEEDBACK,
        ),
    }
    out.violations = c.violations;
    out.ignored = c.ignored;
    out
}

/// A configData violation, and whether it is about an attribute (refused
/// after binding) rather than the body's shape.
struct ConfigViolation {
    violation: Violation,
    attribute: bool,
}

impl std::ops::Deref for ConfigViolation {
    type Target = Violation;
    fn deref(&self) -> &Violation {
        &self.violation
    }
}

struct CheckedConfig {
    mode: Option<String>,
    data: BTreeMap<String, Option<String>>,
    ignored: Vec<String>,
    violations: Vec<ConfigViolation>,
}

/// The characters hawkBit allows in attribute keys and values
/// (`JpaControllerManagement.PATTERN`:
/// `[a-zA-Z0-9_\-!@#$%^&*()+=\[\]{}|;:'",.<>/\\?\s]*`, where `\s` is
/// space, tab, line feed, vertical tab, form feed and carriage return).
pub fn attribute_char_allowed(c: char) -> bool {
    c.is_ascii_alphanumeric() || "_-!@#$%^&*()+=[]{}|;:'\",.<>/\\? \t\n\u{b}\u{c}\r".contains(c)
}

/// Whether hawkBit stores `s` as an attribute key or value: at most
/// [`MAX_ATTRIBUTE`] UTF-16 code units, each allowed
/// (`isAttributeKeyValid`, `isAttributeValueValid`).
pub fn attribute_valid(s: &str) -> bool {
    s.encode_utf16().count() <= MAX_ATTRIBUTE && s.chars().all(attribute_char_allowed)
}

/// Check a configData body against `DdiConfigData` and the attribute rules.
fn check_config_data(body: &[u8], request: &str) -> CheckedConfig {
    let mut c = Checker {
        request,
        violations: Vec::new(),
        ignored: Vec::new(),
    };
    let mut attribute_problems = Vec::new();
    let mut out = CheckedConfig {
        mode: None,
        data: BTreeMap::new(),
        ignored: Vec::new(),
        violations: Vec::new(),
    };
    match serde_json::from_slice::<Value>(body) {
        Err(e) => c.flag("$", format!("not JSON: {e}"), true, SRC_CONFIG),
        Ok(Value::Object(root)) => {
            c.unknown("", &root, &["data", "mode"]);
            match root.get("mode") {
                None | Some(Value::Null) => {}
                Some(Value::String(m)) if ["merge", "replace", "remove"].contains(&m.as_str()) => {
                    out.mode = Some(m.clone())
                }
                Some(other) => c.flag(
                    "mode",
                    format!("{other} is not one of merge, replace, remove"),
                    true,
                    SRC_CONFIG,
                ),
            }
            // `data`: `@NotEmpty`.
            match root.get("data") {
                Some(Value::Object(data)) if !data.is_empty() => {
                    for (k, v) in data {
                        let value = match v {
                            Value::String(s) => Some(s.clone()),
                            // A null value removes the key
                            // (`JpaControllerManagement.copy`).
                            Value::Null => None,
                            other => {
                                c.flag(
                                    &format!("data.{k}"),
                                    format!("{other} is not a string"),
                                    true,
                                    SRC_CONFIG,
                                );
                                continue;
                            }
                        };
                        if !attribute_valid(k) {
                            attribute_problems.push((
                                format!("data.{k}"),
                                format!(
                                    "key {k:?}: more than {MAX_ATTRIBUTE} UTF-16 units or a character outside hawkBit's pattern"
                                ),
                            ));
                        }
                        if let Some(s) = &value {
                            if !attribute_valid(s) {
                                attribute_problems.push((
                                    format!("data.{k}"),
                                    format!(
                                        "value {s:?}: more than {MAX_ATTRIBUTE} UTF-16 units or a character outside hawkBit's pattern"
                                    ),
                                ));
                            }
                        }
                        out.data.insert(k.clone(), value);
                    }
                }
                Some(Value::Object(_)) => c.flag("data", "must not be empty", true, SRC_CONFIG),
                None | Some(Value::Null) => c.flag("data", "required, missing", true, SRC_CONFIG),
                Some(other) => c.flag(
                    "data",
                    format!("{other} is not an object of strings"),
                    true,
                    SRC_CONFIG,
                ),
            }
        }
        Ok(_) => c.flag("$", "not a JSON object", true, SRC_CONFIG),
    }
    out.ignored = c.ignored;
    out.violations = c
        .violations
        .into_iter()
        .map(|v| ConfigViolation {
            violation: v,
            attribute: false,
        })
        .collect();
    for (field, problem) in attribute_problems {
        out.violations.push(ConfigViolation {
            violation: Violation {
                request: request.to_string(),
                field,
                problem,
                refused: true,
                source: SRC_ATTRIBUTES,
            },
            attribute: true,
        });
    }
    out
}

// ---------------------------------------------------------------------------
// JSON written in the documented order.

/// A JSON value whose objects keep their members in the order given.
enum Json {
    Str(String),
    Int(i64),
    Arr(Vec<Json>),
    Obj(Vec<(&'static str, Json)>),
}

impl Json {
    fn str(s: &str) -> Json {
        Json::Str(s.to_string())
    }

    fn obj(members: Vec<(&'static str, Json)>) -> Json {
        Json::Obj(members)
    }

    fn render(&self) -> String {
        let mut out = String::new();
        self.write(&mut out);
        out
    }

    fn write(&self, out: &mut String) {
        match self {
            Json::Str(s) => out.push_str(&Value::String(s.clone()).to_string()),
            Json::Int(n) => out.push_str(&n.to_string()),
            Json::Arr(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    item.write(out);
                }
                out.push(']');
            }
            Json::Obj(members) => {
                out.push('{');
                for (i, (k, v)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String((*k).to_string()).to_string());
                    out.push(':');
                    v.write(out);
                }
                out.push('}');
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn violations(body: &str) -> Vec<(String, bool)> {
        check_feedback(body.as_bytes(), "POST /x")
            .violations
            .into_iter()
            .map(|v| (v.field, v.refused))
            .collect()
    }

    #[test]
    fn a_documented_feedback_has_no_violation_and_unknown_fields_are_ignored() {
        let c = check_feedback(
            br#"{"id":"5","timestamp":1627997501890,"status":{"execution":"closed","result":{"finished":"success","progress":{"cnt":2,"of":5}},"code":200,"details":["Some feedback"]}}"#,
            "POST /x",
        );
        assert!(c.violations.is_empty(), "{:?}", c.violations);
        assert_eq!(c.ignored, vec!["id".to_string()]);
        assert_eq!(c.execution, Some(Execution::Closed));
        assert_eq!(c.finished, Some(Finished::Success));
        assert_eq!(
            c.progress,
            Some(Progress {
                cnt: Some(2),
                of: Some(5)
            })
        );
        assert_eq!(c.code, Some(200));
        assert_eq!(c.timestamp, Some(1_627_997_501_890));
    }

    #[test]
    fn each_broken_field_is_named_and_refused_or_taken_as_hawkbit_does() {
        let ok = r#"{"execution":"proceeding","result":{"finished":"none"}}"#;
        assert!(violations(&format!(r#"{{"status":{ok}}}"#)).is_empty());
        for (body, field, refused) in [
            ("{}", "status", true),
            (
                r#"{"status":{"result":{"finished":"none"}}}"#,
                "status.execution",
                true,
            ),
            (
                r#"{"status":{"execution":"CLOSED","result":{"finished":"none"}}}"#,
                "status.execution",
                true,
            ),
            (
                r#"{"status":{"execution":"done","result":{"finished":"none"}}}"#,
                "status.execution",
                true,
            ),
            (
                r#"{"status":{"execution":"closed"}}"#,
                "status.result",
                true,
            ),
            (
                r#"{"status":{"execution":"closed","result":{}}}"#,
                "status.result.finished",
                true,
            ),
            (
                r#"{"status":{"execution":"closed","result":{"finished":"ok"}}}"#,
                "status.result.finished",
                true,
            ),
            (
                r#"{"status":{"execution":"closed","result":{"finished":"none","progress":{"of":5}}}}"#,
                "status.result.progress.cnt",
                false,
            ),
            (
                r#"{"status":{"execution":"closed","result":{"finished":"none","progress":{"cnt":3000000000,"of":5}}}}"#,
                "status.result.progress.cnt",
                true,
            ),
            (
                r#"{"status":{"execution":"closed","result":{"finished":"none","progress":{"cnt":1.5}}}}"#,
                "status.result.progress.cnt",
                true,
            ),
            (
                r#"{"status":{"execution":"closed","result":{"finished":"none"},"details":"one"}}"#,
                "status.details",
                false,
            ),
            (
                r#"{"status":{"execution":"closed","result":{"finished":"none"},"details":[1]}}"#,
                "status.details[0]",
                true,
            ),
            (
                r#"{"status":{"execution":"closed","result":{"finished":"none"},"details":[null]}}"#,
                "status.details[0]",
                false,
            ),
            (
                r#"{"status":{"execution":"closed","result":{"finished":"none"},"code":"200"}}"#,
                "status.code",
                true,
            ),
            (
                r#"{"timestamp":"1627997501890","status":{"execution":"closed","result":{"finished":"none"}}}"#,
                "timestamp",
                true,
            ),
            ("[]", "$", true),
            ("{", "$", true),
        ] {
            let v = violations(body);
            assert_eq!(v, vec![(field.to_string(), refused)], "{body}");
        }
    }

    #[test]
    fn long_details_count_as_several_messages() {
        assert_eq!(split_message(&"x".repeat(512)).len(), 1);
        assert_eq!(split_message(&"x".repeat(513)).len(), 2);
        // UTF-16 units: a character outside the BMP is two.
        assert_eq!(split_message(&"😀".repeat(257)).len(), 2);
        assert_eq!(split_message("").len(), 1);
    }

    #[test]
    fn hawkbit_ranges_follow_file_streaming_util() {
        let p = |start, end| Range::Part { start, end };
        assert_eq!(hawkbit_ranges("bytes=0-9", 100), p(0, 9));
        assert_eq!(hawkbit_ranges("bytes=90-200", 100), p(90, 99));
        assert_eq!(hawkbit_ranges("bytes=10-", 100), p(10, 99));
        assert_eq!(hawkbit_ranges("bytes=-10", 100), p(90, 99));
        assert_eq!(hawkbit_ranges("bytes=0-1,5-6", 100), Range::Full);
        for unsatisfiable in [
            "bytes=100-",
            "bytes=9-0",
            "bytes=-0",
            "bytes=-",
            "BYTES=0-1",
            "bytes= 0-1",
            "items=0-1",
            "bytes=0-5,3-8",
            "bytes=99999999999999999999-",
        ] {
            assert_eq!(
                hawkbit_ranges(unsatisfiable, 100),
                Range::Unsatisfiable,
                "{unsatisfiable}"
            );
        }
    }

    #[test]
    fn attributes_follow_hawkbits_pattern_and_length() {
        assert!(attribute_valid("hwRevision"));
        assert!(attribute_valid(
            "a b_c-d.e:f/g (h) [i] {j} <k> 'l' \"m\" ?!@#$%^&*+=|;,\\"
        ));
        assert!(attribute_valid(&"k".repeat(128)));
        assert!(!attribute_valid(&"k".repeat(129)));
        for bad in ["é", "~", "`", "\u{0}", "ü1"] {
            assert!(!attribute_valid(bad), "{bad:?}");
        }
    }

    #[test]
    fn config_data_needs_a_non_empty_map_of_strings() {
        let refused = |body: &str| {
            check_config_data(body.as_bytes(), "PUT /x")
                .violations
                .iter()
                .map(|v| (v.field.clone(), v.refused, v.attribute))
                .collect::<Vec<_>>()
        };
        assert!(refused(r#"{"mode":"merge","data":{"VIN":"JH4TB2H26CC000000"}}"#).is_empty());
        assert!(refused(r#"{"data":{"gone":null}}"#).is_empty());
        assert_eq!(
            refused(r#"{"mode":"merge"}"#),
            vec![("data".into(), true, false)]
        );
        assert_eq!(
            refused(r#"{"data":{}}"#),
            vec![("data".into(), true, false)]
        );
        assert_eq!(
            refused(r#"{"mode":"MERGE","data":{"a":"b"}}"#),
            vec![("mode".into(), true, false)]
        );
        assert_eq!(
            refused(r#"{"data":{"a":1}}"#),
            vec![("data.a".into(), true, false)]
        );
        assert_eq!(
            refused(r#"{"data":{"a":"café"}}"#),
            vec![("data.a".into(), true, true)]
        );
    }

    #[test]
    fn json_keeps_the_order_given_and_escapes() {
        let j = Json::obj(vec![
            ("z", Json::str("a\"b")),
            ("a", Json::Arr(vec![Json::Int(-1), Json::obj(vec![])])),
        ]);
        assert_eq!(j.render(), r#"{"z":"a\"b","a":[-1,{}]}"#);
    }

    #[test]
    fn shapes_compare_keys_and_types_both_ways() {
        let doc: Value = serde_json::json!({"a": {"b": 1, "c": ["x"]}});
        assert!(
            shape_differences(&doc, &serde_json::json!({"a": {"b": 2, "c": ["y", "z"]}}))
                .is_empty()
        );
        let d = shape_differences(
            &doc,
            &serde_json::json!({"a": {"b": "1", "c": [3], "d": 0}}),
        );
        assert_eq!(
            d,
            vec![
                "$.a.d: not documented".to_string(),
                "$.a.b: documented number, got string".to_string(),
                "$.a.c[0]: documented string, got number".to_string(),
            ]
        );
    }
}
