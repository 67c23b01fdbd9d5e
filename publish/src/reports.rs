//! Checking what devices reported: each report's signature by its
//! device's key, and that each device's report counters go up by one, so
//! a report replayed, held back, reordered, left out or made up is named.
//!
//! Why on the build host: a fleet operator (or a server's own pipeline)
//! runs `updraft-publish verify-reports` over what the report server
//! stored. The signed form is the `updraft` crate's
//! ([`updraft::signed_report`]), so the device and this check cannot
//! disagree about the bytes.
//!
//! [`check_report`] turns one report's bytes into its signed facts or a
//! refusal; [`decide`] judges a counter against what was seen of the
//! device, a pure function of values; [`Verifier`] feeds one to the
//! other over a stream. Nothing here trusts a field outside the signed
//! payload, and nothing here ever panics on input.

use std::collections::BTreeMap;

use serde_json::{Map, Value};
use updraft::envelope::{MAX_SIGNATURES, decode_base64, pae};
use updraft::signed_report::{
    DDI_LINE_PREFIX, DDI_PAYLOAD_TYPE, DdiSigned, PAYLOAD_TYPE, ddi_message, parse_ddi_line,
};
use updraft::trust::PublicKey;

/// A report larger than this is refused unread (the device's outbox holds
/// at most 1 MiB of bodies; a signed report is its body twice, in part
/// base64).
pub const MAX_REPORT: usize = 4 * 1024 * 1024;

/// What a report's valid signature vouches for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed {
    pub counter: u64,
    /// The counter of the newest report the device had delivered before.
    pub previous: u64,
    /// The device key's id (sha256 of the raw key, hex).
    pub keyid: String,
    pub kind: String,
}

fn field_u64(payload: &Map<String, Value>, name: &str) -> Result<u64, String> {
    match payload.get(name) {
        None => Err(format!("has no {name}")),
        Some(v) => v.as_u64().ok_or(format!(
            "{name} {} is not a counter",
            truncate(&v.to_string())
        )),
    }
}

fn truncate(s: &str) -> &str {
    match s.char_indices().nth(40) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// Check one report as a server received it: a JSON object whose
/// `signed` envelope verifies with one of `keys` and whose other fields
/// are exactly the signed payload's. The error says what is wrong.
pub fn check_report(bytes: &[u8], keys: &[PublicKey]) -> Result<Signed, String> {
    if bytes.len() > MAX_REPORT {
        return Err(format!("is {} bytes, more than {MAX_REPORT}", bytes.len()));
    }
    let outer: Value = serde_json::from_slice(bytes).map_err(|e| format!("is not JSON: {e}"))?;
    let Value::Object(mut outer) = outer else {
        return Err("is not a JSON object".into());
    };
    let env = match outer.remove("signed") {
        None => return Err("is unsigned (no \"signed\" field)".into()),
        Some(Value::Object(env)) => env,
        Some(_) => return Err("has a \"signed\" field that is not an object".into()),
    };
    if env.get("payloadType").and_then(Value::as_str) != Some(PAYLOAD_TYPE) {
        return Err(format!("is not signed as {PAYLOAD_TYPE}"));
    }
    let payload = env
        .get("payload")
        .and_then(Value::as_str)
        .ok_or("has a signature without a payload")?;
    let payload = decode_base64(payload, "the signed payload").map_err(|e| e.to_string())?;
    let Ok(Value::Object(signed)) = serde_json::from_slice::<Value>(&payload) else {
        return Err("has a signed payload that is not a JSON object".into());
    };
    let key = signed
        .get("device_key")
        .and_then(Value::as_str)
        .ok_or("has no device_key in its signed payload")?;
    let raw = decode_base64(key, "device_key").map_err(|e| e.to_string())?;
    let raw: [u8; 32] = raw
        .try_into()
        .map_err(|r: Vec<u8>| format!("device_key is {} bytes, an ed25519 key is 32", r.len()))?;
    let Some(key) = keys.iter().find(|k| k.as_bytes() == &raw) else {
        let keyid = PublicKey::from_bytes(&raw)
            .map(|k| k.keyid())
            .unwrap_or_else(|_| "(not a valid key)".into());
        return Err(format!(
            "is signed by a key that is not a device key given (key id {keyid})"
        ));
    };
    let sigs = env
        .get("signatures")
        .and_then(Value::as_array)
        .ok_or("has no signatures")?;
    if sigs.is_empty() || sigs.len() > MAX_SIGNATURES {
        return Err(format!(
            "has {} signatures (1 to {MAX_SIGNATURES})",
            sigs.len()
        ));
    }
    let message = pae(PAYLOAD_TYPE, &payload);
    let verified = sigs.iter().any(|s| {
        s.get("sig")
            .and_then(Value::as_str)
            .and_then(|t| decode_base64(t, "sig").ok())
            .and_then(|b| <[u8; 64]>::try_from(b).ok())
            .is_some_and(|sig| key.verify(&message, &sig))
    });
    if !verified {
        return Err(
            "has a signature that does not verify with its device key: forged or altered".into(),
        );
    }
    // The readable copy must say what was signed.
    if let Some(name) = differing_field(&outer, &signed) {
        return Err(format!(
            "field {name:?} differs from its signed payload: altered"
        ));
    }
    Ok(Signed {
        counter: field_u64(&signed, "report_counter")?,
        previous: field_u64(&signed, "previous_counter")?,
        keyid: key.keyid(),
        kind: signed
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
    })
}

/// The first field present in one object and not the same in the other.
fn differing_field<'a>(a: &'a Map<String, Value>, b: &'a Map<String, Value>) -> Option<&'a str> {
    a.iter()
        .find(|(k, v)| b.get(*k) != Some(v))
        .map(|(k, _)| k.as_str())
        .or_else(|| b.keys().find(|k| !a.contains_key(*k)).map(String::as_str))
}

/// Check a DDI feedback body (as sent to `path` below the controller
/// resource, e.g. `deploymentBase/8/feedback`): its signature line,
/// verified with `key`, vouches for its counter and what the server keeps.
pub fn check_ddi_feedback(path: &str, body: &Value, key: &PublicKey) -> Result<Signed, String> {
    let line = body["status"]["details"]
        .as_array()
        .and_then(|d| {
            d.iter()
                .filter_map(Value::as_str)
                .find(|l| l.starts_with(DDI_LINE_PREFIX))
        })
        .ok_or("has no signature line in status.details")?;
    let l = parse_ddi_line(line)?;
    let s = DdiSigned::of(path, body, l.counter, l.previous).ok_or("is not a DDI feedback")?;
    if !key.verify(&pae(DDI_PAYLOAD_TYPE, &ddi_message(&s)), &l.sig) {
        return Err(
            "has a signature that does not verify with the device key: forged or altered".into(),
        );
    }
    Ok(Signed {
        counter: l.counter,
        previous: l.previous,
        keyid: key.keyid(),
        kind: "ddi_feedback".into(),
    })
}

/// What one device's reports so far say about the next one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seen {
    /// The highest counter accepted (0 before the first).
    pub last: u64,
    /// Every counter accepted, with the name of the report that had it.
    pub counters: BTreeMap<u64, String>,
}

/// How a validly signed report's counter fits its device's sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The next counter.
    Next,
    /// Counters `from..=to` were never sent: the device says so itself
    /// (its `previous_counter` is the last one seen; it dropped reports
    /// from a full outbox, or ones queued for another kind of server).
    Dropped { from: u64, to: u64 },
    /// This counter was accepted before, in report `first`.
    Replay { first: String },
    /// An older counter never seen, arriving after `last`.
    Reordered { last: u64 },
    /// Counters `from..=to` are missing before this one.
    Gap { from: u64, to: u64 },
}

impl Verdict {
    pub fn accepted(&self) -> bool {
        matches!(self, Verdict::Next | Verdict::Dropped { .. })
    }
}

/// Judge `counter` (with the device's `previous`) against what was seen.
pub fn decide(seen: &Seen, counter: u64, previous: u64) -> Verdict {
    if let Some(first) = seen.counters.get(&counter) {
        return Verdict::Replay {
            first: first.clone(),
        };
    }
    if counter <= seen.last {
        return Verdict::Reordered { last: seen.last };
    }
    if counter == seen.last + 1 {
        return Verdict::Next;
    }
    let (from, to) = (seen.last + 1, counter - 1);
    if previous == seen.last {
        Verdict::Dropped { from, to }
    } else {
        Verdict::Gap { from, to }
    }
}

/// What [`decide`] leaves behind: an accepted or gapped counter becomes
/// the newest (a gap is named once, not at every later report); a replay
/// or a reordered one changes nothing.
pub fn advance(seen: &mut Seen, verdict: &Verdict, counter: u64, name: &str) {
    match verdict {
        Verdict::Next | Verdict::Dropped { .. } | Verdict::Gap { .. } => {
            seen.last = counter;
            seen.counters.insert(counter, name.to_string());
        }
        Verdict::Replay { .. } | Verdict::Reordered { .. } => {}
    }
}

/// The line for one report.
pub fn describe(name: &str, s: &Signed, v: &Verdict) -> String {
    let head = format!("{name}: {} report, counter {}", s.kind, s.counter);
    match v {
        Verdict::Next => format!("{head}: ok"),
        Verdict::Dropped { from, to } => format!(
            "{head}: ok; the device says counters {from} to {to} were never sent (dropped on the device)"
        ),
        Verdict::Replay { first } => {
            format!(
                "{head}: refused: a replay, counter {} was accepted in {first}",
                s.counter
            )
        }
        Verdict::Reordered { last } => {
            format!("{head}: refused: out of order, it arrives after counter {last}")
        }
        Verdict::Gap { from, to } => {
            format!("{head}: refused: counters {from} to {to} are missing before it")
        }
    }
}

/// Checks a stream of reports, per device key.
pub struct Verifier {
    keys: Vec<PublicKey>,
    seen: BTreeMap<String, Seen>,
    pub refused: usize,
    pub checked: usize,
}

impl Verifier {
    pub fn new(keys: Vec<PublicKey>) -> Verifier {
        Verifier {
            keys,
            seen: BTreeMap::new(),
            refused: 0,
            checked: 0,
        }
    }

    /// Check report `name` (its bytes as received); the line to print.
    pub fn check(&mut self, name: &str, bytes: &[u8]) -> String {
        self.checked += 1;
        let s = match check_report(bytes, &self.keys) {
            Ok(s) => s,
            Err(e) => {
                self.refused += 1;
                return match claimed_counter(bytes) {
                    Some(c) => format!("{name}: refused: it (claiming counter {c}) {e}"),
                    None => format!("{name}: refused: it {e}"),
                };
            }
        };
        let seen = self.seen.entry(s.keyid.clone()).or_default();
        let v = decide(seen, s.counter, s.previous);
        advance(seen, &v, s.counter, name);
        if !v.accepted() {
            self.refused += 1;
        }
        describe(name, &s, &v)
    }
}

/// The counter a refused report claims, unverified, for naming it.
fn claimed_counter(bytes: &[u8]) -> Option<u64> {
    if bytes.len() > MAX_REPORT {
        return None;
    }
    serde_json::from_slice::<Value>(bytes).ok()?["report_counter"].as_u64()
}

/// Split a file of reports into named reports: one JSON document, or
/// JSON lines (blank lines skipped), named `FILE` or `FILE:LINE`.
pub fn split(file: &str, text: &[u8]) -> Vec<(String, Vec<u8>)> {
    if serde_json::from_slice::<Value>(text).is_ok() {
        return vec![(file.to_string(), text.to_vec())];
    }
    text.split(|b| *b == b'\n')
        .enumerate()
        .filter(|(_, l)| !l.iter().all(u8::is_ascii_whitespace))
        .map(|(i, l)| (format!("{file}:{}", i + 1), l.to_vec()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use updraft::device_key::DeviceKey;
    use updraft::signed_report::seal;

    fn key(seed: u8) -> DeviceKey {
        DeviceKey::from_seed(&[seed; 32]).unwrap()
    }

    fn report(k: &DeviceKey, counter: u64, previous: u64) -> Vec<u8> {
        let fields = json!({"kind": "state", "device_id": "d1", "state": "idle",
            "report_counter": counter, "previous_counter": previous});
        let Value::Object(fields) = fields else {
            unreachable!()
        };
        Value::Object(seal(fields, k)).to_string().into_bytes()
    }

    fn seen(last: u64, counters: &[u64]) -> Seen {
        Seen {
            last,
            counters: counters.iter().map(|c| (*c, format!("r{c}"))).collect(),
        }
    }

    #[test]
    fn counters_are_judged_against_what_the_device_sent_before() {
        // (seen: last and counters, counter, previous) → verdict
        let cases = [
            (seen(0, &[]), 1, 0, Verdict::Next),
            (seen(3, &[1, 2, 3]), 4, 3, Verdict::Next),
            (
                seen(3, &[1, 2, 3]),
                2,
                1,
                Verdict::Replay { first: "r2".into() },
            ),
            (
                seen(3, &[1, 2, 3]),
                3,
                2,
                Verdict::Replay { first: "r3".into() },
            ),
            // A gap was named at 5; 4 arriving late is out of order.
            (seen(5, &[1, 2, 3, 5]), 4, 3, Verdict::Reordered { last: 5 }),
            (seen(3, &[1, 2, 3]), 6, 5, Verdict::Gap { from: 4, to: 5 }),
            (seen(0, &[]), 2, 1, Verdict::Gap { from: 1, to: 1 }),
            // The device says 4 and 5 never left it.
            (
                seen(3, &[1, 2, 3]),
                6,
                3,
                Verdict::Dropped { from: 4, to: 5 },
            ),
            (
                seen(3, &[1, 2, 3]),
                u64::MAX,
                2,
                Verdict::Gap {
                    from: 4,
                    to: u64::MAX - 1,
                },
            ),
        ];
        for (i, (s, counter, previous, want)) in cases.into_iter().enumerate() {
            assert_eq!(decide(&s, counter, previous), want, "row {i}");
        }
    }

    #[test]
    fn a_gap_is_named_once_and_a_refused_replay_changes_nothing() {
        let mut s = seen(3, &[1, 2, 3]);
        let v = decide(&s, 6, 5);
        advance(&mut s, &v, 6, "r6");
        assert_eq!(decide(&s, 7, 6), Verdict::Next);
        let before = s.clone();
        let v = decide(&s, 2, 1);
        advance(&mut s, &v, 2, "again");
        assert_eq!(s, before);
    }

    #[test]
    fn a_stream_in_order_verifies_and_each_kind_of_tampering_is_named() {
        let k = key(1);
        let mut v = Verifier::new(vec![k.public().clone()]);
        for c in 1..=3 {
            let line = v.check(&format!("r{c}"), &report(&k, c, c - 1));
            assert!(line.ends_with(": ok"), "{line}");
        }
        assert_eq!(v.refused, 0);
        let replay = v.check("again", &report(&k, 2, 1));
        assert!(
            replay.contains("refused: a replay, counter 2 was accepted in r2"),
            "{replay}"
        );
        let gap = v.check("r6", &report(&k, 6, 5));
        assert!(gap.contains("counters 4 to 5 are missing"), "{gap}");
        let late = v.check("r4", &report(&k, 4, 3));
        assert!(
            late.contains("out of order, it arrives after counter 6"),
            "{late}"
        );
        let mut forged: Value = serde_json::from_slice(&report(&k, 7, 6)).unwrap();
        forged["state"] = json!("committed");
        let line = v.check("r7", forged.to_string().as_bytes());
        assert!(
            line.starts_with("r7: refused: it (claiming counter 7) field \"state\" differs"),
            "{line}"
        );
        assert_eq!(v.refused, 4);
    }

    #[test]
    fn hostile_reports_are_refused_with_what_is_wrong() {
        let k = key(1);
        let good = report(&k, 1, 0);
        let mut altered: Value = serde_json::from_slice(&good).unwrap();
        altered["state"] = json!("committed");
        let mut forged: Value = serde_json::from_slice(&good).unwrap();
        forged["signed"]["signatures"][0]["sig"] =
            json!(updraft::envelope::encode_base64(&[7u8; 64]));
        let mut truncated: Value = serde_json::from_slice(&good).unwrap();
        let sig = truncated["signed"]["signatures"][0]["sig"]
            .as_str()
            .unwrap()
            .to_string();
        truncated["signed"]["signatures"][0]["sig"] = json!(sig[..40]);
        let mut huge: Value = serde_json::from_slice(&good).unwrap();
        huge["signed"]["signatures"] = json!(vec![json!({"sig": sig}); MAX_SIGNATURES + 1]);
        let mut no_payload: Value = serde_json::from_slice(&good).unwrap();
        no_payload["signed"]["payload"] = json!(42);
        let big_counter = {
            let fields = json!({"kind": "state", "report_counter": 1e300, "previous_counter": 0});
            let Value::Object(f) = fields else {
                unreachable!()
            };
            Value::Object(seal(f, &k)).to_string().into_bytes()
        };
        let s = |v: &Value| v.to_string().into_bytes();
        // (bytes, keys the verifier knows, words the refusal must contain)
        let cases: Vec<(Vec<u8>, Vec<PublicKey>, &str)> = vec![
            (
                b"{\"kind\": \"state\"".to_vec(),
                vec![k.public().clone()],
                "is not JSON",
            ),
            (
                b"[1, 2]".to_vec(),
                vec![k.public().clone()],
                "not a JSON object",
            ),
            (
                b"{\"kind\": \"state\"}".to_vec(),
                vec![k.public().clone()],
                "unsigned",
            ),
            (
                b"{\"signed\": 1}".to_vec(),
                vec![k.public().clone()],
                "not an object",
            ),
            (
                b"{\"n\": 1e999}".to_vec(),
                vec![k.public().clone()],
                "is not JSON",
            ),
            (
                "[".repeat(10_000).into_bytes(),
                vec![k.public().clone()],
                "is not JSON",
            ),
            (
                vec![b' '; MAX_REPORT + 1],
                vec![k.public().clone()],
                "more than",
            ),
            (
                good.clone(),
                vec![key(2).public().clone()],
                "not a device key given",
            ),
            (
                s(&altered),
                vec![k.public().clone()],
                "field \"state\" differs",
            ),
            (s(&forged), vec![k.public().clone()], "does not verify"),
            (s(&truncated), vec![k.public().clone()], "does not verify"),
            (s(&huge), vec![k.public().clone()], "17 signatures"),
            (
                s(&no_payload),
                vec![k.public().clone()],
                "without a payload",
            ),
            (
                big_counter,
                vec![k.public().clone()],
                "report_counter 1e+300 is not a counter",
            ),
        ];
        for (i, (bytes, keys, words)) in cases.into_iter().enumerate() {
            let e = check_report(&bytes, &keys).unwrap_err();
            assert!(e.contains(words), "case {i}: {e}");
        }
        assert_eq!(
            check_report(&good, &[k.public().clone()]).unwrap().counter,
            1
        );
    }

    #[test]
    fn a_signed_ddi_feedback_verifies_and_an_altered_one_does_not() {
        let k = key(3);
        let body = json!({"id": "8", "status": {"execution": "closed",
            "result": {"finished": "success"}, "details": ["installed release 1.1"]}});
        let path = "deploymentBase/8/feedback";
        let s = DdiSigned::of(path, &body, 5, 4).unwrap();
        let line = updraft::signed_report::ddi_line(&s, &k);
        let mut signed = body.clone();
        signed["status"]["details"]
            .as_array_mut()
            .unwrap()
            .push(json!(line));
        let ok = check_ddi_feedback(path, &signed, k.public()).unwrap();
        assert_eq!((ok.counter, ok.previous), (5, 4));
        let mut altered = signed.clone();
        altered["status"]["result"]["finished"] = json!("failure");
        assert!(
            check_ddi_feedback(path, &altered, k.public())
                .unwrap_err()
                .contains("does not verify")
        );
        assert!(check_ddi_feedback("deploymentBase/9/feedback", &signed, k.public()).is_err());
        assert!(
            check_ddi_feedback(path, &body, k.public())
                .unwrap_err()
                .contains("no signature line")
        );
    }

    #[test]
    fn a_file_is_one_report_or_json_lines() {
        assert_eq!(split("a.json", b"{\n \"k\": 1\n}\n").len(), 1);
        let lines = split("r.jsonl", b"{\"k\": 1}\n\n{\"k\": 2}\nnot json\n");
        let names: Vec<&str> = lines.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["r.jsonl:1", "r.jsonl:3", "r.jsonl:4"]);
    }
}
