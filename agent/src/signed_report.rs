//! The signed form of a report: which bytes the device key signs, and how
//! the signature travels, for static-server reports and DDI feedback.
//!
//! Why here and alone: the device makes these bytes and the verifier
//! (`updraft-publish verify-reports`) must remake or read exactly the same
//! ones, so both use this one definition. No JSON is canonicalised:
//!
//! * A **static-server report** carries a DSSE envelope in its `signed`
//!   field whose payload is the report's JSON bytes exactly as signed
//!   (every other field of the report, `signed` left out), and whose
//!   signature is ed25519 over the DSSE pre-authentication encoding of
//!   [`PAYLOAD_TYPE`] and those bytes. The report's other fields are a
//!   readable copy of the payload; a verifier compares them with it.
//! * A **DDI feedback** has room only for short `details` lines (hawkBit
//!   keeps them as the action's messages), so its last line
//!   ([`ddi_line`]) carries the counter and the signature over a
//!   length-prefixed (netstring) encoding of what the server keeps of the
//!   feedback ([`ddi_message`]).
//!
//! This module encodes and parses; it never decides whether a counter is
//! acceptable (the verifier's pure rules) nor reads a key file.

use serde_json::{Map, Value, json};

use crate::device_key::DeviceKey;
use crate::envelope::pae;
use crate::keys::{decode_base64, encode_base64};

/// The DSSE payload type of a signed static-server report.
pub const PAYLOAD_TYPE: &str = "application/vnd.updraft.report+json";
/// The DSSE payload type of a signed DDI feedback's message.
pub const DDI_PAYLOAD_TYPE: &str = "application/vnd.updraft.ddi-feedback";
/// How a DDI feedback's signature line begins.
pub const DDI_LINE_PREFIX: &str = "updraft-signed ";

/// The manifest serial a report body answers: its job's, or a release of
/// components' `serial`.
pub fn manifest_serial(body: &Map<String, Value>) -> Option<u64> {
    body.get("job")
        .and_then(|j| j.get("serial"))
        .or_else(|| body.get("serial"))
        .and_then(Value::as_u64)
}

/// Sign a report's fields: `device_key` (the raw public key in base64) is
/// added, then the whole object is the payload of the `signed` envelope.
pub fn seal(mut fields: Map<String, Value>, key: &DeviceKey) -> Map<String, Value> {
    fields.remove("signed");
    fields.insert(
        "device_key".into(),
        json!(encode_base64(key.public().as_bytes())),
    );
    let payload = Value::Object(fields.clone()).to_string().into_bytes();
    let sig = key.sign(&pae(PAYLOAD_TYPE, &payload));
    fields.insert(
        "signed".into(),
        json!({
            "payloadType": PAYLOAD_TYPE,
            "payload": encode_base64(&payload),
            "signatures": [{ "keyid": key.public().keyid(), "sig": encode_base64(&sig) }],
        }),
    );
    fields
}

/// What a DDI feedback's signature covers besides its counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DdiSigned<'a> {
    /// Below the controller resource, e.g. `deploymentBase/8/feedback`.
    pub path: &'a str,
    pub execution: &'a str,
    pub finished: &'a str,
    /// `status.result.progress` as `cnt/of`, or empty.
    pub progress: String,
    pub details: Vec<&'a str>,
    pub counter: u64,
    pub previous: u64,
}

impl<'a> DdiSigned<'a> {
    /// Read what is signed from a feedback body (`details` without the
    /// signature line), or `None` when the body is not a feedback.
    pub fn of(path: &'a str, body: &'a Value, counter: u64, previous: u64) -> Option<Self> {
        let status = body.get("status")?;
        let progress = match status["result"].get("progress") {
            Some(p) => format!("{}/{}", p["cnt"].as_u64()?, p["of"].as_u64()?),
            None => String::new(),
        };
        Some(DdiSigned {
            path,
            execution: status["execution"].as_str()?,
            finished: status["result"]["finished"].as_str()?,
            progress,
            details: status["details"]
                .as_array()?
                .iter()
                .filter_map(Value::as_str)
                .filter(|d| !d.starts_with(DDI_LINE_PREFIX))
                .collect(),
            counter,
            previous,
        })
    }
}

fn netstring(out: &mut Vec<u8>, field: &[u8]) {
    out.extend_from_slice(field.len().to_string().as_bytes());
    out.push(b':');
    out.extend_from_slice(field);
    out.push(b',');
}

/// The bytes a DDI feedback's signature covers (before the DSSE
/// pre-authentication encoding): netstrings of `v1`, the path, execution,
/// finished, progress, counter, previous counter, then each detail line.
pub fn ddi_message(s: &DdiSigned<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    for f in [
        "v1",
        s.path,
        s.execution,
        s.finished,
        &s.progress,
        &s.counter.to_string(),
        &s.previous.to_string(),
    ] {
        netstring(&mut out, f.as_bytes());
    }
    for d in &s.details {
        netstring(&mut out, d.as_bytes());
    }
    out
}

/// The signature line of a DDI feedback:
/// `updraft-signed counter=N previous=P keyid=HEX sig=BASE64`.
pub fn ddi_line(s: &DdiSigned<'_>, key: &DeviceKey) -> String {
    let sig = key.sign(&pae(DDI_PAYLOAD_TYPE, &ddi_message(s)));
    format!(
        "{DDI_LINE_PREFIX}counter={} previous={} keyid={} sig={}",
        s.counter,
        s.previous,
        key.public().keyid(),
        encode_base64(&sig)
    )
}

/// A parsed signature line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DdiLine {
    pub counter: u64,
    pub previous: u64,
    pub keyid: String,
    pub sig: [u8; 64],
}

/// Parse a signature line; the error names what is wrong.
pub fn parse_ddi_line(line: &str) -> Result<DdiLine, String> {
    let rest = line
        .strip_prefix(DDI_LINE_PREFIX)
        .ok_or("not an updraft signature line")?;
    let mut fields = rest.split(' ');
    let mut next = |name: &str| -> Result<&str, String> {
        fields
            .next()
            .and_then(|f| f.strip_prefix(name)?.strip_prefix('='))
            .ok_or(format!("signature line has no {name}"))
    };
    let number = |name: &str, v: &str| -> Result<u64, String> {
        v.parse()
            .map_err(|_| format!("signature line's {name} {v:?} is not a counter"))
    };
    let counter = number("counter", next("counter")?)?;
    let previous = number("previous", next("previous")?)?;
    let keyid = next("keyid")?.to_string();
    let sig = decode_base64(next("sig")?, "signature line's sig").map_err(|e| e.to_string())?;
    let sig: [u8; 64] = sig
        .try_into()
        .map_err(|s: Vec<u8>| format!("signature is {} bytes, an ed25519 one is 64", s.len()))?;
    Ok(DdiLine {
        counter,
        previous,
        keyid,
        sig,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> DeviceKey {
        DeviceKey::from_seed(&[9; 32]).unwrap()
    }

    #[test]
    fn a_sealed_report_carries_its_own_bytes_signed_by_the_device() {
        let mut fields = Map::new();
        fields.insert("kind".into(), json!("state"));
        fields.insert("report_counter".into(), json!(7));
        let sealed = seal(fields, &key());
        let env = &sealed["signed"];
        assert_eq!(env["payloadType"], PAYLOAD_TYPE);
        let payload = decode_base64(env["payload"].as_str().unwrap(), "payload").unwrap();
        let inner: Value = serde_json::from_slice(&payload).unwrap();
        let mut outer = sealed.clone();
        outer.remove("signed");
        assert_eq!(inner, Value::Object(outer));
        let sig = decode_base64(env["signatures"][0]["sig"].as_str().unwrap(), "sig").unwrap();
        let sig: [u8; 64] = sig.try_into().unwrap();
        assert!(key().public().verify(&pae(PAYLOAD_TYPE, &payload), &sig));
        assert_eq!(
            env["signatures"][0]["keyid"].as_str().unwrap(),
            key().public().keyid()
        );
    }

    #[test]
    fn the_manifest_serial_is_the_jobs_or_the_releases() {
        let cases = [
            (json!({"job": {"serial": 4}}), Some(4)),
            (json!({"serial": 5}), Some(5)),
            (json!({"kind": "heartbeat"}), None),
            (json!({"job": {"serial": "4"}}), None),
        ];
        for (body, want) in cases {
            assert_eq!(manifest_serial(body.as_object().unwrap()), want, "{body}");
        }
    }

    #[test]
    fn netstrings_keep_fields_apart_where_joining_would_not() {
        let a = DdiSigned {
            path: "deploymentBase/8/feedback",
            execution: "closed",
            finished: "success",
            progress: String::new(),
            details: vec!["ab", "c"],
            counter: 1,
            previous: 0,
        };
        let b = DdiSigned {
            details: vec!["a", "bc"],
            ..a.clone()
        };
        assert_ne!(ddi_message(&a), ddi_message(&b));
        assert!(ddi_message(&a).starts_with(b"2:v1,25:deploymentBase/8/feedback,6:closed,"));
    }

    #[test]
    fn a_ddi_line_reads_back_and_its_signature_covers_the_feedback() {
        let body = json!({"id": "8", "status": {"execution": "closed",
            "result": {"finished": "success", "progress": {"cnt": 2, "of": 3}},
            "details": ["installed release 1.1"]}});
        let s = DdiSigned::of("deploymentBase/8/feedback", &body, 3, 2).unwrap();
        assert_eq!(s.progress, "2/3");
        let line = ddi_line(&s, &key());
        assert!(line.len() <= crate::ddi::MAX_DETAIL, "{line}");
        let parsed = parse_ddi_line(&line).unwrap();
        assert_eq!((parsed.counter, parsed.previous), (3, 2));
        let msg = pae(DDI_PAYLOAD_TYPE, &ddi_message(&s));
        assert!(key().public().verify(&msg, &parsed.sig));
        let other = DdiSigned {
            finished: "failure",
            ..s
        };
        assert!(
            !key()
                .public()
                .verify(&pae(DDI_PAYLOAD_TYPE, &ddi_message(&other)), &parsed.sig)
        );
    }

    #[test]
    fn a_malformed_ddi_line_is_refused_naming_the_field() {
        let cases = [
            ("counter=1", "not an updraft signature line"),
            ("updraft-signed previous=1", "no counter"),
            (
                "updraft-signed counter=99999999999999999999 previous=1",
                "not a counter",
            ),
            ("updraft-signed counter=1 previous=0 keyid=x", "no sig"),
            (
                "updraft-signed counter=1 previous=0 keyid=x sig=!!",
                "not valid base64",
            ),
            (
                "updraft-signed counter=1 previous=0 keyid=x sig=AAAA",
                "3 bytes",
            ),
        ];
        for (line, words) in cases {
            let e = parse_ddi_line(line).unwrap_err();
            assert!(e.contains(words), "{line}: {e}");
        }
    }
}
