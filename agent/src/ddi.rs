//! The documents of hawkBit's Direct Device Integration (DDI) API, the
//! polling protocol of Eclipse hawkBit and of servers implementing it
//! (gooseBit): what the server sends, parsed so that nothing in it is
//! trusted, and what the device sends, built field by field as the DDI
//! JSON models define them (`hawkbit-ddi-api`, `org.eclipse.hawkbit.ddi.
//! json.model`: `DdiControllerBase`, `DdiDeploymentBase`, `DdiCancel`,
//! `DdiActionFeedback`, `DdiConfigData`).
//!
//! Why a module of its own: a DDI server orchestrates (which device gets
//! which distribution set, when), but it is not trusted with what is
//! installed. The signed manifest decides that, exactly as in static mode,
//! so everything read here is a hint to be checked against it: an action
//! id, links, file names, sizes and hashes. The parsers therefore accept
//! the documented shapes and fields they do not know (the models ignore
//! unknown properties, and servers add some), and refuse, with the field
//! named, anything that could be used against the device: links that are
//! not absolute `https` URLs or carry credentials, file names that are
//! paths, more chunks, artifacts or bytes than a release can need, an
//! action id that is not a plain token.
//!
//! This module owns the shapes, their limits and the polling interval's
//! bounds. It never makes a request, never follows a link (which origin
//! may receive credentials is the client's rule), and never decides to
//! install anything.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::error::{Context, Error, Result};
use crate::hash::{Sha256, truncate};
use crate::{bail, err};

/// The most a DDI document may hold: a deploymentBase with the largest
/// release (every chunk and artifact at its cap) stays far below it.
pub const MAX_DOCUMENT_BYTES: usize = 256 * 1024;
/// Chunks (software modules) in one deployment.
pub const MAX_CHUNKS: usize = 16;
/// Artifacts in one chunk: the manifest, the image and its deltas, the
/// key documents, a bundle.
pub const MAX_ARTIFACTS: usize = 64;
/// Bytes of an artifact's file name.
pub const MAX_FILENAME: usize = 255;
/// Bytes of a link.
pub const MAX_URL: usize = 2048;
/// Bytes of an action id, a chunk's part, name or version.
pub const MAX_TOKEN: usize = 128;
/// `configData` attributes: hawkBit keeps keys and values of at most 128
/// characters.
pub const MAX_ATTRIBUTE: usize = 128;
/// Lines of `details` in one feedback, and bytes per line.
pub const MAX_DETAILS: usize = 8;
pub const MAX_DETAIL: usize = 512;

/// The default bounds `config.polling.sleep` is clamped to
/// (`server.ddi_sleep_min`, `server.ddi_sleep_max`): a server cannot make
/// a device poll more often than every 30 s, nor stay away more than a
/// day.
pub const MIN_SLEEP: Duration = Duration::from_secs(30);
pub const MAX_SLEEP: Duration = Duration::from_secs(24 * 3600);

/// An action the controller base points at, with its id taken from the
/// link (`…/deploymentBase/5?c=…` is action 5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActionLink {
    pub href: String,
    pub action_id: String,
}

/// The controller base (`GET {base}/{tenant}/controller/v1/{id}`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ControllerBase {
    /// `config.polling.sleep`, as the server sent it (not clamped).
    pub sleep: Option<Duration>,
    pub deployment: Option<ActionLink>,
    pub cancel: Option<ActionLink>,
    /// Where to `PUT` the configuration data, when the server asks for it.
    pub config_data: Option<String>,
}

/// `deployment.download` and `deployment.update`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Handling {
    /// Not now: the action stays open.
    Skip,
    /// The server asks; local policy may make it wait.
    Attempt,
    /// The server requests it now.
    Forced,
}

/// `deployment.maintenanceWindow`: present only when the action has a
/// maintenance schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MaintenanceWindow {
    Available,
    Unavailable,
}

/// One artifact of a chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Artifact {
    pub filename: String,
    pub size: Option<u64>,
    pub sha256: Option<Sha256>,
    /// `_links.download`: the `https` link (`download-http` is never used).
    pub download: Option<String>,
}

/// One chunk (a software module) of a deployment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub part: String,
    pub name: String,
    pub version: String,
    pub artifacts: Vec<Artifact>,
}

/// A deploymentBase (`GET` of the controller base's `deploymentBase` link).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deployment {
    pub action_id: String,
    pub download: Handling,
    pub update: Handling,
    pub maintenance_window: Option<MaintenanceWindow>,
    pub chunks: Vec<Chunk>,
}

impl Deployment {
    /// The artifact named `filename`, looked up in every chunk: exactly
    /// one must carry it.
    pub fn artifact(&self, filename: &str) -> Result<&Artifact> {
        let mut found = self
            .chunks
            .iter()
            .flat_map(|c| c.artifacts.iter())
            .filter(|a| a.filename == filename);
        match (found.next(), found.next()) {
            (Some(a), None) => Ok(a),
            (None, _) => bail!(
                Malformed,
                "deployment {}: no artifact named {filename:?}",
                self.action_id
            ),
            (Some(_), Some(_)) => bail!(
                Malformed,
                "deployment {}: more than one artifact named {filename:?}",
                self.action_id
            ),
        }
    }
}

/// What a job remembers of the DDI action that assigned it: the action id
/// its feedback goes to, and how the server wants it handled, as of the
/// last deploymentBase read (`href` carries hawkBit's `?c=` hash, which
/// changes when the action does, e.g. when its maintenance window opens).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Action {
    pub id: String,
    pub href: String,
    pub download: Handling,
    pub update: Handling,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance_window: Option<MaintenanceWindow>,
}

impl Action {
    /// The action as `deployment` describes it, read from `href`.
    pub fn of(deployment: &Deployment, href: &str) -> Action {
        Action {
            id: deployment.action_id.clone(),
            href: href.to_string(),
            download: deployment.download,
            update: deployment.update,
            maintenance_window: deployment.maintenance_window,
        }
    }
}

/// A cancelAction (`GET` of the controller base's `cancelAction` link).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cancel {
    pub action_id: String,
    /// The action to stop (`cancelAction.stopId`).
    pub stop_id: String,
}

/// `status.execution` of a feedback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Execution {
    Proceeding,
    Downloaded,
    Closed,
    Canceled,
    Rejected,
    Scheduled,
    Resumed,
    Download,
}

impl Execution {
    pub fn as_str(self) -> &'static str {
        match self {
            Execution::Proceeding => "proceeding",
            Execution::Downloaded => "downloaded",
            Execution::Closed => "closed",
            Execution::Canceled => "canceled",
            Execution::Rejected => "rejected",
            Execution::Scheduled => "scheduled",
            Execution::Resumed => "resumed",
            Execution::Download => "download",
        }
    }
}

/// `status.result.finished` of a feedback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
}

/// A feedback to `{deploymentBase or cancelAction}/{id}/feedback`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Feedback {
    pub action_id: String,
    pub execution: Execution,
    pub finished: Finished,
    /// `status.result.progress` (`cnt` of `of`).
    pub progress: Option<(u64, u64)>,
    /// `status.details`: at most [`MAX_DETAILS`] lines, each cut to
    /// [`MAX_DETAIL`] bytes at a character boundary.
    pub details: Vec<String>,
    /// Milliseconds since the epoch when the device made the feedback (an
    /// outbox may deliver it much later).
    pub timestamp_ms: u64,
}

impl Feedback {
    /// The request body. `id` is the action id as older servers require
    /// it; newer ones ignore it.
    pub fn to_json(&self) -> Vec<u8> {
        let mut result = Map::new();
        result.insert("finished".into(), json!(self.finished.as_str()));
        if let Some((cnt, of)) = self.progress {
            result.insert("progress".into(), json!({ "cnt": cnt, "of": of }));
        }
        let details: Vec<String> = self
            .details
            .iter()
            .take(MAX_DETAILS)
            .map(|d| truncate(d, MAX_DETAIL).to_string())
            .collect();
        let body = json!({
            "id": self.action_id,
            "timestamp": self.timestamp_ms,
            "status": {
                "execution": self.execution.as_str(),
                "result": Value::Object(result),
                "details": details,
            }
        });
        body.to_string().into_bytes()
    }
}

/// The body of a `PUT` to the `configData` link: `attributes` merged into
/// what the server holds. Keys must be 1 to [`MAX_ATTRIBUTE`] characters
/// of hawkBit's attribute alphabet ([`is_attribute_char`]), or they are
/// refused; a value is made to fit: cut to [`MAX_ATTRIBUTE`] characters,
/// each character outside the alphabet replaced by `_` (hawkBit refuses
/// the whole request otherwise, and a release version is shown, not
/// parsed, there).
pub fn config_data(attributes: &[(&str, &str)]) -> Result<Vec<u8>> {
    let mut data = Map::new();
    for (k, v) in attributes {
        if k.is_empty() || k.chars().count() > MAX_ATTRIBUTE || !k.chars().all(is_attribute_char) {
            bail!(
                Usage,
                "configData key {k:?} must be 1 to {MAX_ATTRIBUTE} characters of letters, digits, spaces and !@#$%^&*()+=[]{{}}|;:'\",.<>/\\?_-"
            );
        }
        let value: String = v
            .chars()
            .take(MAX_ATTRIBUTE)
            .map(|c| if is_attribute_char(c) { c } else { '_' })
            .collect();
        data.insert((*k).to_string(), json!(value));
    }
    if data.is_empty() {
        bail!(Usage, "configData needs at least one attribute");
    }
    Ok(json!({ "mode": "merge", "data": Value::Object(data) })
        .to_string()
        .into_bytes())
}

/// Whether hawkBit takes `c` in a target attribute's key or value
/// (`JpaControllerManagement`: `[a-zA-Z0-9_\-!@#$%^&*()+=\[\]{}|;:'",.<>/\\?\s]`).
pub fn is_attribute_char(c: char) -> bool {
    c.is_ascii_alphanumeric()
        || c.is_ascii_whitespace()
        || "_-!@#$%^&*()+=[]{}|;:'\",.<>/\\?".contains(c)
}

/// `HH:MM:SS` as hawkBit writes `polling.sleep`.
pub fn parse_sleep(s: &str) -> Result<Duration> {
    let bad = || err!(Malformed, "polling sleep {s:?} is not HH:MM:SS");
    let mut parts = s.split(':');
    let (Some(h), Some(m), Some(sec), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad());
    };
    let field = |f: &str, max: u64| -> Result<u64> {
        if f.is_empty() || f.len() > 3 || !f.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let v: u64 = f.parse().map_err(|_| bad())?;
        if v > max {
            return Err(bad());
        }
        Ok(v)
    };
    let (h, m, sec) = (field(h, 999)?, field(m, 59)?, field(sec, 59)?);
    Ok(Duration::from_secs(h * 3600 + m * 60 + sec))
}

/// The server's sleep within [`MIN_SLEEP`]..=[`MAX_SLEEP`].
pub fn clamp_sleep(d: Duration) -> Duration {
    d.clamp(MIN_SLEEP, MAX_SLEEP)
}

/// Parse a controller base.
pub fn controller_base(bytes: &[u8]) -> Result<ControllerBase> {
    let doc = document(bytes, "controller base")?;
    let root = At::root(&doc, "controller base");
    let polling = match root.field("config")? {
        Some(c) => c.field("polling")?,
        None => None,
    };
    let sleep = match polling.map(|p| p.field("sleep")).transpose()?.flatten() {
        Some(s) => Some(parse_sleep(s.str()?).context("controller base config.polling.sleep")?),
        None => None,
    };
    let links = root.field("_links")?;
    let href = |name: &str| -> Result<Option<&str>> {
        match links.as_ref().map(|l| l.field(name)).transpose()?.flatten() {
            Some(l) => Ok(Some(l.required("href")?.str()?)),
            None => Ok(None),
        }
    };
    let action = |what: &str| -> Result<Option<ActionLink>> {
        let Some(h) = href(what)? else {
            return Ok(None);
        };
        let href = link(h, &format!("controller base _links.{what}"))?;
        let action_id = action_id_of(&href, what)?;
        Ok(Some(ActionLink { href, action_id }))
    };
    Ok(ControllerBase {
        sleep,
        deployment: action("deploymentBase")?,
        cancel: action("cancelAction")?,
        config_data: match href("configData")? {
            Some(h) => Some(link(h, "controller base _links.configData")?),
            None => None,
        },
    })
}

/// Parse a deploymentBase.
pub fn deployment(bytes: &[u8]) -> Result<Deployment> {
    let doc = document(bytes, "deploymentBase")?;
    let root = At::root(&doc, "deploymentBase");
    let action_id = token(root.required("id")?.str()?, "deploymentBase id")?;
    let what = |field: &str| format!("deployment {action_id}: {field}");
    let d = root.required("deployment")?;
    let handling = |name: &str| -> Result<Handling> {
        let Some(h) = d.field(name)? else {
            return Ok(Handling::Attempt);
        };
        Ok(match h.str()? {
            "skip" => Handling::Skip,
            "attempt" => Handling::Attempt,
            "forced" => Handling::Forced,
            other => return Err(h.unknown(other, "skip, attempt or forced")),
        })
    };
    let (download, update) = (handling("download")?, handling("update")?);
    let maintenance_window = match d.field("maintenanceWindow")? {
        Some(w) => Some(match w.str()? {
            "available" => MaintenanceWindow::Available,
            "unavailable" => MaintenanceWindow::Unavailable,
            other => return Err(w.unknown(other, "available or unavailable")),
        }),
        None => None,
    };
    let raw_chunks = d.required("chunks")?.items()?;
    if raw_chunks.is_empty() {
        bail!(Malformed, "{}", what("no chunks"));
    }
    if raw_chunks.len() > MAX_CHUNKS {
        bail!(
            Malformed,
            "{}",
            what(&format!(
                "{} chunks (at most {MAX_CHUNKS})",
                raw_chunks.len()
            ))
        );
    }
    let mut chunks = Vec::with_capacity(raw_chunks.len());
    for (i, c) in raw_chunks.iter().enumerate() {
        let at = |f: &str| what(&format!("chunks[{i}].{f}"));
        let artifacts = match c.field("artifacts")? {
            Some(a) => a.items()?,
            None => Vec::new(),
        };
        if artifacts.len() > MAX_ARTIFACTS {
            bail!(
                Malformed,
                "{} (at most {MAX_ARTIFACTS})",
                at(&format!("artifacts: {}", artifacts.len()))
            );
        }
        let mut out = Vec::with_capacity(artifacts.len());
        for (j, a) in artifacts.iter().enumerate() {
            let at = |f: &str| what(&format!("chunks[{i}].artifacts[{j}].{f}"));
            let filename =
                filename(a.required("filename")?.str()?).with_context(|| at("filename"))?;
            let sha256 = match a.field("hashes")?.map(|h| h.field("sha256")).transpose()? {
                Some(Some(h)) => {
                    Some(Sha256::from_hex(h.str()?).with_context(|| at("hashes.sha256"))?)
                }
                _ => None,
            };
            let size = a.field("size")?.map(|s| s.u64()).transpose()?;
            let download = match a
                .field("_links")?
                .map(|l| l.field("download"))
                .transpose()?
            {
                Some(Some(l)) => Some(link(l.required("href")?.str()?, &at("_links.download"))?),
                _ => None,
            };
            out.push(Artifact {
                filename,
                size,
                sha256,
                download,
            });
        }
        chunks.push(Chunk {
            part: token_text(c.required("part")?.str()?, &at("part"))?,
            name: token_text(c.required("name")?.str()?, &at("name"))?,
            version: token_text(c.required("version")?.str()?, &at("version"))?,
            artifacts: out,
        });
    }
    Ok(Deployment {
        download,
        update,
        maintenance_window,
        chunks,
        action_id,
    })
}

/// Parse a cancelAction.
pub fn cancel(bytes: &[u8]) -> Result<Cancel> {
    let doc = document(bytes, "cancelAction")?;
    let root = At::root(&doc, "cancelAction");
    let action_id = token(root.required("id")?.str()?, "cancelAction id")?;
    let stop = root.required("cancelAction")?.required("stopId")?;
    let stop_id = token(stop.str()?, "cancelAction stopId")?;
    Ok(Cancel { action_id, stop_id })
}

/// A JSON document of at most [`MAX_DOCUMENT_BYTES`].
fn document(bytes: &[u8], what: &str) -> Result<Value> {
    if bytes.len() > MAX_DOCUMENT_BYTES {
        bail!(
            Malformed,
            "{what} is {} bytes (at most {MAX_DOCUMENT_BYTES})",
            bytes.len()
        );
    }
    serde_json::from_slice(bytes).map_err(|e| err!(Malformed, "{what}: {e}"))
}

/// A value in a DDI document and where it is, for errors that name the
/// field. The documents are read as the server writes them: every field
/// the models mark optional is optional (absent or `null`), unknown fields
/// are ignored, and a field of the wrong type is refused.
struct At<'v> {
    value: &'v Value,
    /// The document, e.g. `deploymentBase`.
    doc: &'static str,
    /// The field, e.g. `deployment.chunks[0].part`; empty for the root.
    path: String,
}

impl<'v> At<'v> {
    fn root(value: &'v Value, doc: &'static str) -> At<'v> {
        At {
            value,
            doc,
            path: String::new(),
        }
    }

    fn child(&self, value: &'v Value, path: String) -> At<'v> {
        At {
            value,
            doc: self.doc,
            path,
        }
    }

    /// Field `key` of this object; `None` when it is absent or `null`.
    fn field(&self, key: &str) -> Result<Option<At<'v>>> {
        let Value::Object(map) = self.value else {
            return Err(self.wrong("an object"));
        };
        Ok(match map.get(key) {
            None | Some(Value::Null) => None,
            Some(v) => Some(self.child(v, self.path_of(key))),
        })
    }

    /// The path of field `key` of this object.
    fn path_of(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    /// Field `key` of this object, which must be there (a `null` is
    /// refused by the reading that follows).
    fn required(&self, key: &str) -> Result<At<'v>> {
        let Value::Object(map) = self.value else {
            return Err(self.wrong("an object"));
        };
        match map.get(key) {
            Some(v) => Ok(self.child(v, self.path_of(key))),
            None if self.path.is_empty() => bail!(Malformed, "{}: missing field `{key}`", self.doc),
            None => bail!(
                Malformed,
                "{}: missing field `{key}` in {}",
                self.doc,
                self.path
            ),
        }
    }

    /// The items of this array.
    fn items(&self) -> Result<Vec<At<'v>>> {
        let Value::Array(items) = self.value else {
            return Err(self.wrong("an array"));
        };
        Ok(items
            .iter()
            .enumerate()
            .map(|(i, v)| self.child(v, format!("{}[{i}]", self.path)))
            .collect())
    }

    fn str(&self) -> Result<&'v str> {
        self.value.as_str().ok_or_else(|| self.wrong("a string"))
    }

    fn u64(&self) -> Result<u64> {
        self.value
            .as_u64()
            .ok_or_else(|| self.wrong("a non-negative integer"))
    }

    /// This value is not of the `expected` type.
    fn wrong(&self, expected: &str) -> Error {
        let found = match self.value {
            Value::Null => "null".to_string(),
            Value::Bool(b) => b.to_string(),
            Value::Number(n) => n.to_string(),
            Value::String(_) => "a string".to_string(),
            Value::Array(_) => "an array".to_string(),
            Value::Object(_) => "an object".to_string(),
        };
        let at = if self.path.is_empty() { "" } else { " " };
        err!(
            Malformed,
            "{}{at}{}: expected {expected}, found {found}",
            self.doc,
            self.path
        )
    }

    /// This string is none of the values `known`.
    fn unknown(&self, value: &str, known: &str) -> Error {
        err!(
            Malformed,
            "{} {}: {:?} is not {known}",
            self.doc,
            self.path,
            truncate(value, 64)
        )
    }
}

/// An absolute `https` URL without credentials, whitespace or control
/// characters.
fn link(href: &str, what: &str) -> Result<String> {
    if href.len() > MAX_URL {
        bail!(
            Malformed,
            "{what}: a link of {} bytes (at most {MAX_URL})",
            href.len()
        );
    }
    let Some(rest) = href.strip_prefix("https://") else {
        bail!(Malformed, "{what}: {href:?} is not an https URL");
    };
    if href.chars().any(|c| c.is_whitespace() || c.is_control()) {
        bail!(
            Malformed,
            "{what}: {href:?} holds whitespace or control characters"
        );
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.is_empty() {
        bail!(Malformed, "{what}: {href:?} names no host");
    }
    if authority.contains('@') {
        bail!(Malformed, "{what}: {href:?} carries credentials");
    }
    Ok(href.to_string())
}

/// The action id in an action link: the path segment after `…/{what}/`.
fn action_id_of(href: &str, what: &str) -> Result<String> {
    let path = href.split(['?', '#']).next().unwrap_or("");
    let mut segments = path.rsplit('/');
    let (Some(id), Some(kind)) = (segments.next(), segments.next()) else {
        bail!(Malformed, "{what} link {href:?} names no action");
    };
    if kind != what {
        bail!(
            Malformed,
            "{what} link {href:?} does not end in /{what}/<action id>"
        );
    }
    token(id, &format!("the action id in {what} link {href:?}"))
}

/// Whether `s` may stand as one segment of a DDI path (a tenant, a
/// controller id): 1 to [`MAX_TOKEN`] ASCII letters, digits, `.`, `_`,
/// `-` or `:`, and not `.` or `..`.
pub fn is_path_token(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_TOKEN
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':'))
}

/// An id: 1 to [`MAX_TOKEN`] ASCII letters, digits, `-` or `_`.
fn token(s: &str, what: &str) -> Result<String> {
    if s.is_empty()
        || s.len() > MAX_TOKEN
        || !s
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        bail!(
            Malformed,
            "{what} {:?} is not 1 to {MAX_TOKEN} letters, digits, '-' or '_'",
            truncate(s, 64)
        );
    }
    Ok(s.to_string())
}

/// A display text (a part, a name, a version): at most [`MAX_TOKEN`]
/// bytes, no control characters.
fn token_text(s: &str, what: &str) -> Result<String> {
    if s.len() > MAX_TOKEN || s.chars().any(char::is_control) {
        bail!(
            Malformed,
            "{what} {:?} is longer than {MAX_TOKEN} bytes or holds control characters",
            truncate(s, 64)
        );
    }
    Ok(s.to_string())
}

/// A file name, never a path.
fn filename(s: &str) -> Result<String> {
    if s.is_empty()
        || s.len() > MAX_FILENAME
        || s == "."
        || s == ".."
        || s.contains(['/', '\\'])
        || s.chars().any(char::is_control)
    {
        bail!(
            Malformed,
            "{:?} is not a file name of 1 to {MAX_FILENAME} bytes without '/', '\\' or control characters",
            truncate(s, 64)
        );
    }
    Ok(s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{Rng, mutate};

    // The controller base and deploymentBase examples of hawkBit's DDI
    // JSON models (hawkbit-ddi-api, DdiControllerBase and
    // DdiDeploymentBase), shortened to one artifact per chunk.
    const BASE: &str = r#"{
      "config" : { "polling" : { "sleep" : "12:00:00" } },
      "_links" : {
        "deploymentBase" : { "href" : "https://management-api.host.com/TENANT_ID/controller/v1/CONTROLLER_ID/deploymentBase/5?c=-2127183556" },
        "installedBase" : { "href" : "https://management-api.host.com/TENANT_ID/controller/v1/CONTROLLER_ID/installedBase/4" },
        "configData" : { "href" : "https://management-api.host.com/TENANT_ID/controller/v1/CONTROLLER_ID/configData" }
      }
    }"#;

    const DEPLOYMENT: &str = r#"{
      "id" : "8",
      "deployment" : {
        "download" : "forced",
        "update" : "forced",
        "maintenanceWindow" : "available",
        "chunks" : [ {
          "part" : "jvm",
          "version" : "1.0.75",
          "name" : "oneapp runtime",
          "artifacts" : [ {
            "filename" : "binary.tgz",
            "hashes" : {
              "sha1" : "986a1ade8b8a2f758ce951340cc5e21335cc2a00",
              "md5" : "d04440e6533863247655ac5fd4345bcc",
              "sha256" : "b3a04740a19e36057ccf258701922f3cd2f1a880536be53a3ca8d50f6b615975"
            },
            "size" : 13,
            "_links" : {
              "download" : { "href" : "https://link-to-cdn.com/api/v1/TENANT_ID/download/controller/CONTROLLER_ID/softwaremodules/23/filename/binary.tgz" },
              "download-http" : { "href" : "http://link-to-cdn.com/api/v1/TENANT_ID/download/controller/CONTROLLER_ID/softwaremodules/23/filename/binary.tgz" }
            }
          } ]
        }, {
          "part" : "os",
          "version" : "1.0.79",
          "name" : "one Firmware",
          "artifacts" : [ {
            "filename" : "binary.tgz.signature",
            "size" : 3,
            "_links" : {
              "download" : { "href" : "https://link-to-cdn.com/api/v1/TENANT_ID/download/controller/CONTROLLER_ID/softwaremodules/24/filename/binary.tgz.signature" }
            }
          } ]
        } ]
      },
      "actionHistory" : { "status" : "TestStatus", "messages" : [ "Action status message 1" ] }
    }"#;

    #[test]
    fn the_documented_controller_base_gives_the_sleep_and_the_action() {
        let b = controller_base(BASE.as_bytes()).unwrap();
        assert_eq!(b.sleep, Some(Duration::from_secs(12 * 3600)));
        let d = b.deployment.unwrap();
        assert_eq!(d.action_id, "5");
        assert!(d.href.ends_with("/deploymentBase/5?c=-2127183556"));
        assert_eq!(b.cancel, None);
        assert!(b.config_data.unwrap().ends_with("/configData"));
    }

    #[test]
    fn a_controller_base_with_nothing_to_do_is_empty() {
        assert_eq!(
            controller_base(br#"{"config":{"polling":{"sleep":"00:05:00"}},"_links":{}}"#).unwrap(),
            ControllerBase {
                sleep: Some(Duration::from_secs(300)),
                ..ControllerBase::default()
            }
        );
        assert_eq!(controller_base(b"{}").unwrap(), ControllerBase::default());
    }

    #[test]
    fn a_cancel_link_names_its_action() {
        let b = controller_base(
            br#"{"_links":{"cancelAction":{"href":"https://h/t/controller/v1/d/cancelAction/11"}}}"#,
        )
        .unwrap();
        assert_eq!(b.cancel.unwrap().action_id, "11");
        let c = cancel(br#"{"id":"11","cancelAction":{"stopId":"10"}, "unknownProperty": "test"}"#)
            .unwrap();
        assert_eq!(
            c,
            Cancel {
                action_id: "11".into(),
                stop_id: "10".into()
            }
        );
    }

    #[test]
    fn the_documented_deployment_gives_chunks_artifacts_and_https_links() {
        let d = deployment(DEPLOYMENT.as_bytes()).unwrap();
        assert_eq!(d.action_id, "8");
        assert_eq!(d.download, Handling::Forced);
        assert_eq!(d.update, Handling::Forced);
        assert_eq!(d.maintenance_window, Some(MaintenanceWindow::Available));
        assert_eq!(d.chunks.len(), 2);
        assert_eq!(d.chunks[0].part, "jvm");
        assert_eq!(d.chunks[1].version, "1.0.79");
        let a = d.artifact("binary.tgz").unwrap();
        assert_eq!(a.size, Some(13));
        assert_eq!(
            a.sha256.unwrap().to_hex(),
            "b3a04740a19e36057ccf258701922f3cd2f1a880536be53a3ca8d50f6b615975"
        );
        // `download`, never `download-http`.
        assert!(a.download.as_deref().unwrap().starts_with("https://"));
        let sig = d.artifact("binary.tgz.signature").unwrap();
        assert_eq!(sig.sha256, None);
        assert!(d.artifact("missing").is_err());
    }

    #[test]
    fn skip_attempt_and_no_window_are_read_and_absent_handling_is_attempt() {
        let doc = |dl: &str, up: &str, window: &str| {
            format!(
                r#"{{"id":"3","deployment":{{{dl}{up}{window}"chunks":[{{"part":"os","version":"2","name":"n"}}]}}}}"#
            )
        };
        let d = deployment(doc(r#""download":"skip","#, r#""update":"attempt","#, "").as_bytes())
            .unwrap();
        assert_eq!((d.download, d.update), (Handling::Skip, Handling::Attempt));
        assert_eq!(d.maintenance_window, None);
        assert!(d.chunks[0].artifacts.is_empty());
        let d =
            deployment(doc("", "", r#""maintenanceWindow":"unavailable","#).as_bytes()).unwrap();
        assert_eq!(
            (d.download, d.update),
            (Handling::Attempt, Handling::Attempt)
        );
        assert_eq!(d.maintenance_window, Some(MaintenanceWindow::Unavailable));
    }

    /// A deployment whose first artifact has `field` set to `value` (raw
    /// JSON).
    fn with_artifact(field: &str, value: &str) -> String {
        format!(
            r#"{{"id":"8","deployment":{{"chunks":[{{"part":"os","version":"1","name":"n","artifacts":[{{"filename":"a.img","size":1,"{field}":{value}}}]}}]}}}}"#
        )
    }

    fn refused(bytes: &[u8]) -> String {
        match deployment(bytes) {
            Ok(d) => panic!("accepted {d:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn hostile_deployments_are_refused_naming_the_field() {
        let cases: Vec<(String, &str)> = vec![
            (
                with_artifact("_links", r#"{"download":{"href":"http://cdn/a.img"}}"#),
                "artifacts[0]._links.download: \"http://cdn/a.img\" is not an https URL",
            ),
            (
                with_artifact(
                    "_links",
                    r#"{"download":{"href":"https://user:pw@cdn/a.img"}}"#,
                ),
                "carries credentials",
            ),
            (
                with_artifact("_links", r#"{"download":{"href":"https:///a.img"}}"#),
                "names no host",
            ),
            (
                with_artifact("_links", r#"{"download":{"href":"https://cdn/a b"}}"#),
                "whitespace or control",
            ),
            (
                with_artifact("hashes", r#"{"sha256":"zz"}"#),
                "hashes.sha256",
            ),
            (
                DEPLOYMENT.replace("\"binary.tgz\"", "\"../../etc/passwd\""),
                "is not a file name",
            ),
            (
                DEPLOYMENT.replace("\"id\" : \"8\"", "\"id\" : \"8/../9\""),
                "deploymentBase id",
            ),
            (
                DEPLOYMENT.replace("\"id\" : \"8\"", "\"id\" : 8"),
                "deploymentBase",
            ),
            (
                DEPLOYMENT.replace("\"size\" : 13", "\"size\" : -13"),
                "deploymentBase",
            ),
            (
                DEPLOYMENT.replace("\"forced\"", "\"sometimes\""),
                "deploymentBase",
            ),
            (
                r#"{"id":"8","deployment":{"chunks":[]}}"#.to_string(),
                "deployment 8: no chunks",
            ),
            (
                r#"{"id":"8","deployment":{}}"#.to_string(),
                "missing field `chunks`",
            ),
            (
                DEPLOYMENT.replace("\"oneapp runtime\"", "\"one\\u0007app\""),
                "chunks[0].name",
            ),
        ];
        for (doc, want) in cases {
            let e = refused(doc.as_bytes());
            assert!(e.contains(want), "{want:?} not in {e:?}\n{doc}");
        }
    }

    #[test]
    fn oversized_deployments_are_refused_before_they_are_parsed() {
        let big = format!(
            r#"{{"id":"8","deployment":{{"chunks":[]}},"pad":"{}"}}"#,
            "x".repeat(MAX_DOCUMENT_BYTES)
        );
        assert!(refused(big.as_bytes()).contains("at most 262144"));
        let chunk = r#"{"part":"os","version":"1","name":"n"}"#;
        let many = format!(
            r#"{{"id":"8","deployment":{{"chunks":[{}]}}}}"#,
            vec![chunk; MAX_CHUNKS + 1].join(",")
        );
        assert!(refused(many.as_bytes()).contains("17 chunks (at most 16)"));
        let artifact = r#"{"filename":"f","size":1}"#;
        let many = format!(
            r#"{{"id":"8","deployment":{{"chunks":[{{"part":"os","version":"1","name":"n","artifacts":[{}]}}]}}}}"#,
            vec![artifact; MAX_ARTIFACTS + 1].join(",")
        );
        assert!(refused(many.as_bytes()).contains("artifacts: 65 (at most 64)"));
    }

    #[test]
    fn an_artifact_named_twice_is_ambiguous() {
        let doc = DEPLOYMENT.replace("\"binary.tgz.signature\"", "\"binary.tgz\"");
        let d = deployment(doc.as_bytes()).unwrap();
        let e = d.artifact("binary.tgz").unwrap_err().to_string();
        assert!(
            e.contains("more than one artifact named \"binary.tgz\""),
            "{e}"
        );
    }

    #[test]
    fn action_links_must_end_in_their_kind_and_a_plain_id() {
        for (href, want) in [
            ("https://h/c/v1/d/deploymentBase/", "is not 1 to 128"),
            (
                "https://h/c/v1/d/installedBase/5",
                "does not end in /deploymentBase/",
            ),
            ("https://h/c/v1/d/deploymentBase/5%2F..", "is not 1 to 128"),
            ("http://h/c/v1/d/deploymentBase/5", "not an https URL"),
        ] {
            let doc = format!(r#"{{"_links":{{"deploymentBase":{{"href":"{href}"}}}}}}"#);
            let e = controller_base(doc.as_bytes()).unwrap_err().to_string();
            assert!(e.contains(want), "{href}: {want:?} not in {e:?}");
        }
    }

    #[test]
    fn polling_sleep_is_hh_mm_ss_and_clamped() {
        assert_eq!(parse_sleep("00:00:45").unwrap(), Duration::from_secs(45));
        assert_eq!(
            parse_sleep("100:00:00").unwrap(),
            Duration::from_secs(360_000)
        );
        for bad in [
            "",
            "12:00",
            "12:60:00",
            "00:00:60",
            "1:2:3:4",
            "-1:00:00",
            "aa:00:00",
            "0x1:00:00",
            "1234:00:00",
            "123",
        ] {
            assert!(parse_sleep(bad).is_err(), "{bad}");
        }
        assert_eq!(clamp_sleep(Duration::from_secs(1)), MIN_SLEEP);
        assert_eq!(clamp_sleep(Duration::from_secs(360_000)), MAX_SLEEP);
        assert_eq!(
            clamp_sleep(Duration::from_secs(600)),
            Duration::from_secs(600)
        );
        let e = controller_base(br#"{"config":{"polling":{"sleep":"soon"}}}"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("config.polling.sleep") && e.contains("\"soon\""),
            "{e}"
        );
    }

    #[test]
    fn feedback_bodies_have_the_documented_fields() {
        let f = Feedback {
            action_id: "8".into(),
            execution: Execution::Proceeding,
            finished: Finished::None,
            progress: Some((2, 5)),
            details: vec!["downloading image: 40 of 100 MB".into()],
            timestamp_ms: 1_627_997_501_890,
        };
        let v: Value = serde_json::from_slice(&f.to_json()).unwrap();
        assert_eq!(
            v,
            json!({
                "id": "8",
                "timestamp": 1_627_997_501_890u64,
                "status": {
                    "execution": "proceeding",
                    "result": { "finished": "none", "progress": { "cnt": 2, "of": 5 } },
                    "details": ["downloading image: 40 of 100 MB"]
                }
            })
        );
        let closed = Feedback {
            execution: Execution::Closed,
            finished: Finished::Failure,
            progress: None,
            details: vec!["é".repeat(400); MAX_DETAILS + 3],
            ..f
        };
        let v: Value = serde_json::from_slice(&closed.to_json()).unwrap();
        assert_eq!(v["status"]["execution"], "closed");
        assert_eq!(v["status"]["result"], json!({ "finished": "failure" }));
        let details = v["status"]["details"].as_array().unwrap();
        assert_eq!(details.len(), MAX_DETAILS);
        assert!(
            details
                .iter()
                .all(|d| d.as_str().unwrap().len() <= MAX_DETAIL)
        );
    }

    #[test]
    fn config_data_merges_attributes_within_hawkbits_limits() {
        let v: Value = serde_json::from_slice(
            &config_data(&[("compatible", "acme-gw"), ("sw_version", "1.0")]).unwrap(),
        )
        .unwrap();
        assert_eq!(
            v,
            json!({ "mode": "merge", "data": { "compatible": "acme-gw", "sw_version": "1.0" } })
        );
        assert!(config_data(&[("", "x")]).is_err());
        assert!(config_data(&[(&"k".repeat(129), "x")]).is_err());
        assert!(config_data(&[("k~", "x")]).is_err());
        assert!(config_data(&[]).is_err());
        let v: Value = serde_json::from_slice(
            &config_data(&[("k", &"v".repeat(129)), ("sw_version", "1.0~rc1 ünï`")]).unwrap(),
        )
        .unwrap();
        assert_eq!(v["data"]["k"].as_str().unwrap().len(), MAX_ATTRIBUTE);
        assert_eq!(v["data"]["sw_version"], "1.0_rc1 _n__");
    }

    #[test]
    fn mutated_documents_never_panic() {
        let mut rng = Rng(0xdd1);
        for seed in [
            BASE,
            DEPLOYMENT,
            r#"{"id":"1","cancelAction":{"stopId":"1"}}"#,
        ] {
            for _ in 0..3000 {
                let m = mutate(&mut rng, seed.as_bytes());
                let _ = controller_base(&m);
                let _ = deployment(&m);
                let _ = cancel(&m);
            }
        }
    }
}
