//! The metrics file is valid Prometheus text exposition: written through
//! the `updraft` library with realistic values, read back by a real parser
//! (the `prometheus_client` Python package's
//! `text_string_to_metric_families`), and every family, type, label and
//! value is what the daemon set.
//!
//! Needs `python3` with `prometheus_client` (`pip install prometheus_client`);
//! without them the test fails and says so, because the format check is the
//! point of the test.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use updraft::Kind;
use updraft::metrics::Metrics;
use updraft::slot::SlotName;
use updraft::timestamp::Timestamp;

const PARSER: &str = r#"
import json, sys
try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError as e:
    sys.stderr.write("prometheus_client is not installed (pip install prometheus_client): %s\n" % e)
    sys.exit(3)
with open(sys.argv[1], encoding="utf-8") as f:
    text = f.read()
out = []
for fam in text_string_to_metric_families(text):
    out.append({
        "name": fam.name,
        "type": fam.type,
        "help": fam.documentation,
        "samples": [{"name": s.name, "labels": s.labels, "value": s.value} for s in fam.samples],
    })
json.dump(out, sys.stdout)
"#;

struct Family {
    kind: String,
    help: String,
    samples: Vec<(String, BTreeMap<String, String>, f64)>,
}

fn parse_with_prometheus_client(path: &PathBuf) -> BTreeMap<String, Family> {
    let out = match Command::new("python3")
        .arg("-c")
        .arg(PARSER)
        .arg(path)
        .output()
    {
        Ok(o) => o,
        Err(e) => panic!(
            "python3 is needed to check the metrics format with prometheus_client \
             (apt-get install python3; pip install prometheus_client): {e}"
        ),
    };
    assert!(
        out.status.success(),
        "parsing {} with prometheus_client failed ({}): {}",
        path.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let parsed: Value = serde_json::from_slice(&out.stdout).expect("parser output is JSON");
    let mut families = BTreeMap::new();
    for fam in parsed.as_array().expect("a list of families") {
        let samples = fam["samples"]
            .as_array()
            .expect("samples")
            .iter()
            .map(|s| {
                let labels = s["labels"]
                    .as_object()
                    .expect("labels")
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().expect("label value").to_string()))
                    .collect();
                (
                    s["name"].as_str().expect("name").to_string(),
                    labels,
                    s["value"].as_f64().expect("value"),
                )
            })
            .collect();
        let name = fam["name"].as_str().expect("family name").to_string();
        let family = Family {
            kind: fam["type"].as_str().expect("type").to_string(),
            help: fam["help"].as_str().expect("help").to_string(),
            samples,
        };
        assert!(
            families.insert(name.clone(), family).is_none(),
            "family {name} appears twice"
        );
    }
    families
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The value of the sample `name{labels}` in family `family`.
fn value(fams: &BTreeMap<String, Family>, family: &str, name: &str, l: &[(&str, &str)]) -> f64 {
    let fam = fams
        .get(family)
        .unwrap_or_else(|| panic!("family {family} missing; have {:?}", fams.keys()));
    let want = labels(l);
    fam.samples
        .iter()
        .find(|(n, ls, _)| n == name && *ls == want)
        .map(|(_, _, v)| *v)
        .unwrap_or_else(|| {
            panic!(
                "sample {name}{want:?} missing from {family}: {:?}",
                fam.samples
            )
        })
}

const AWKWARD_VERSION: &str = "2.1.0 \"field-test\" C:\\builds\\rc1\nsecond line";

fn metrics_file(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "updraft-metrics-format-{tag}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join("updraft.prom")
}

#[test]
fn the_metrics_file_parses_with_prometheus_client_and_carries_every_value() {
    updraft_tests::require!("python3", "py:prometheus_client");
    let mut m = Metrics::new();
    m.record_check(Timestamp(1_796_040_000), true);
    // Every fifth check fails, the last one (45) included.
    for i in 1..=45 {
        m.record_check(Timestamp(1_796_040_000 + i * 1800), i % 5 != 0);
    }
    for _ in 0..9 {
        m.record_error(Kind::Network);
    }
    m.record_error(Kind::Signature);
    m.record_error(Kind::Integrity);
    m.record_signature_failure();
    m.add_downloaded(1_234_567_890);
    m.add_downloaded(4_096);
    m.set_last_install_duration(Duration::from_millis(187_500));
    m.set_booted_slot(SlotName::B);
    m.set_release(SlotName::A, Some("2.0.3"));
    m.set_release(SlotName::B, Some(AWKWARD_VERSION));
    m.set_state("testing");
    m.set_outbox_depth(12);

    let path = metrics_file("full");
    m.write(&path).expect("write metrics");
    let fams = parse_with_prometheus_client(&path);

    // Counters: the family name drops `_total`, the sample keeps it.
    assert_eq!(fams["updraft_checks"].kind, "counter");
    assert_eq!(
        value(&fams, "updraft_checks", "updraft_checks_total", &[]),
        46.0
    );
    assert_eq!(fams["updraft_errors"].kind, "counter");
    for (kind, want) in [
        ("network", 9.0),
        ("signature", 1.0),
        ("integrity", 1.0),
        ("bootloader", 0.0),
    ] {
        assert_eq!(
            value(
                &fams,
                "updraft_errors",
                "updraft_errors_total",
                &[("kind", kind)]
            ),
            want,
            "updraft_errors_total{{kind=\"{kind}\"}}"
        );
    }
    let kinds = fams["updraft_errors"].samples.len();
    assert_eq!(kinds, 17, "every error kind is exposed from zero");
    assert_eq!(
        value(
            &fams,
            "updraft_signature_failures",
            "updraft_signature_failures_total",
            &[]
        ),
        1.0
    );
    assert_eq!(
        value(
            &fams,
            "updraft_downloaded_bytes",
            "updraft_downloaded_bytes_total",
            &[]
        ),
        1_234_571_986.0
    );

    // Gauges.
    let last = 1_796_040_000.0 + 45.0 * 1800.0;
    assert_eq!(fams["updraft_last_check_timestamp_seconds"].kind, "gauge");
    assert_eq!(
        value(
            &fams,
            "updraft_last_check_timestamp_seconds",
            "updraft_last_check_timestamp_seconds",
            &[]
        ),
        last
    );
    assert_eq!(
        value(
            &fams,
            "updraft_last_successful_check_timestamp_seconds",
            "updraft_last_successful_check_timestamp_seconds",
            &[]
        ),
        last - 1800.0,
        "the last check failed, the one before succeeded"
    );
    assert_eq!(
        value(
            &fams,
            "updraft_last_install_duration_seconds",
            "updraft_last_install_duration_seconds",
            &[]
        ),
        187.5
    );
    assert_eq!(
        value(
            &fams,
            "updraft_booted_slot",
            "updraft_booted_slot",
            &[("slot", "A")]
        ),
        0.0
    );
    assert_eq!(
        value(
            &fams,
            "updraft_booted_slot",
            "updraft_booted_slot",
            &[("slot", "B")]
        ),
        1.0
    );
    assert_eq!(
        value(&fams, "updraft_outbox_depth", "updraft_outbox_depth", &[]),
        12.0
    );

    // Info metric, with a label value full of quotes, backslashes and a newline.
    assert_eq!(
        value(
            &fams,
            "updraft_release_info",
            "updraft_release_info",
            &[("slot", "A"), ("version", "2.0.3")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &fams,
            "updraft_release_info",
            "updraft_release_info",
            &[("slot", "B"), ("version", AWKWARD_VERSION)]
        ),
        1.0
    );

    // State set: exactly one state is 1.
    let states = &fams["updraft_state"].samples;
    let current: Vec<&str> = states
        .iter()
        .filter(|s| s.2 == 1.0)
        .map(|s| s.1["state"].as_str())
        .collect();
    assert_eq!(current, ["testing"]);
    assert!(
        states.len() >= 10 && states.iter().all(|s| s.2 == 0.0 || s.2 == 1.0),
        "{states:?}"
    );

    // Build info and documentation.
    let build = &fams["updraft_build_info"].samples;
    assert_eq!(build.len(), 1);
    assert_eq!(build[0].2, 1.0);
    for (name, fam) in &fams {
        assert!(!fam.help.is_empty(), "{name} has no HELP");
        assert!(name.starts_with("updraft_"), "{name}");
    }

    let _ = std::fs::remove_dir_all(path.parent().expect("temp dir"));
}

#[test]
fn a_fresh_daemon_writes_a_parseable_file_without_unknown_values() {
    updraft_tests::require!("python3", "py:prometheus_client");
    let path = metrics_file("fresh");
    Metrics::new().write(&path).expect("write metrics");
    let fams = parse_with_prometheus_client(&path);
    assert_eq!(
        value(&fams, "updraft_checks", "updraft_checks_total", &[]),
        0.0
    );
    assert_eq!(
        value(
            &fams,
            "updraft_state",
            "updraft_state",
            &[("state", "idle")]
        ),
        1.0
    );
    for absent in [
        "updraft_last_check_timestamp_seconds",
        "updraft_last_install_duration_seconds",
        "updraft_booted_slot",
        "updraft_release_info",
    ] {
        assert!(
            !fams.contains_key(absent),
            "{absent} must be absent until known"
        );
    }
    let _ = std::fs::remove_dir_all(path.parent().expect("temp dir"));
}
