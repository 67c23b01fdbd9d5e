//! The protection file beside the database (`protected.json`), read back
//! after power cuts and worn sectors: whatever its bytes, decoding names an
//! error or gives a protection that encodes and decodes to itself. The
//! input is tried as the whole file and, so that the body's parser is
//! reached past the checksum, as a body wrapped with its own checksum.
#![no_main]

use libfuzzer_sys::fuzz_target;
use updraft::hash::Sha256;
use updraft::protect::{decode, encode};

fuzz_target!(|data: &[u8]| {
    check(data);
    if let Ok(body) = std::str::from_utf8(data) {
        let wrapped = format!(
            "{{\"format\":1,\"body\":{},\"sha256\":\"{}\"}}",
            json_string(body),
            Sha256::of(body.as_bytes()).to_hex()
        );
        check(wrapped.as_bytes());
    }
});

/// `s` as a JSON string literal.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn check(bytes: &[u8]) {
    match decode(bytes) {
        Ok(p) => {
            let again = encode(&p).map(|b| decode(&b));
            assert!(
                matches!(&again, Ok(Ok(q)) if *q == p),
                "a decoded protection does not survive encoding: {again:?}"
            );
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}
