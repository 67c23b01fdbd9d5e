//! Untrusted `grubenv` bytes: the block parser must accept or reject, never
//! panic; a block that parses serialises back to the same bytes, and a
//! change to one variable keeps every other line.
#![no_main]

use libfuzzer_sys::fuzz_target;
use updraft::bootloader::grub::{GRUBENV_HEADER, GRUBENV_SIZE, parse_grubenv, serialize_grubenv};

fuzz_target!(|data: &[u8]| {
    let _ = parse_grubenv(data);

    // Most inputs fail the size and header checks; also try the fuzzer's
    // bytes as the body of a well-framed block.
    let mut block = GRUBENV_HEADER.to_vec();
    block.extend_from_slice(&data[..data.len().min(GRUBENV_SIZE - GRUBENV_HEADER.len())]);
    block.resize(GRUBENV_SIZE, b'#');
    if let Ok(env) = parse_grubenv(&block) {
        assert_eq!(serialize_grubenv(&env).ok().as_deref(), Some(&block[..]));
        let mut changed = env.clone();
        if changed.set("ORDER", "B A").is_ok() {
            if let Ok(out) = serialize_grubenv(&changed) {
                let reparsed = parse_grubenv(&out).expect("a serialised block parses");
                assert_eq!(reparsed.get("ORDER").as_deref(), Some(&b"B A"[..]));
                let others = |e: &updraft::bootloader::grub::GrubEnv| {
                    e.vars()
                        .filter(|(n, _)| *n != b"ORDER")
                        .map(|(n, v)| (n.to_vec(), v))
                        .collect::<Vec<_>>()
                };
                assert_eq!(others(&reparsed), others(&env));
            }
        }
    }
});
