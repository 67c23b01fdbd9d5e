//! Untrusted U-Boot environment bytes and `fw_env.config` text: the copy
//! decoder, the entry parser, copy selection and the config parser must
//! accept or reject, never panic; what parses must serialise back to an
//! image that parses to the same variables.
#![no_main]

use libfuzzer_sys::fuzz_target;
use updraft::bootloader::uboot::{
    Environment, decode_copy, encode_copy, parse_env_data, parse_fw_env_config, parse_image,
    select_copy, serialize_env_data,
};

fuzz_target!(|data: &[u8]| {
    let _ = parse_fw_env_config(&String::from_utf8_lossy(data));

    for redundant in [false, true] {
        let _ = parse_image(data, redundant);
        if let Ok(copy) = decode_copy(data, redundant) {
            let _ = select_copy([copy.crc_ok(), true], [copy.flags.unwrap_or(0), data[0]]);
        }
    }

    // The data area parser on its own, as if the CRC had matched.
    if let Ok(env) = parse_env_data(data) {
        let size = env.encoded_len().max(data.len());
        if let Ok(area) = serialize_env_data(&env, size) {
            assert_eq!(parse_env_data(&area).ok().as_ref(), Some(&env));
        }
        let size = env.encoded_len() + 5;
        if let Ok(image) = encode_copy(&env, size, Some(data.len() as u8)) {
            assert_eq!(parse_image(&image, true).ok().as_ref(), Some(&env));
        }
        // Setting a model variable keeps every other entry.
        let mut changed: Environment = env.clone();
        if changed.set("BOOT_ORDER", "B A").is_ok() {
            let others = |e: &Environment| {
                e.entries()
                    .filter(|x| !x.starts_with(b"BOOT_ORDER="))
                    .map(<[u8]>::to_vec)
                    .collect::<Vec<_>>()
            };
            assert_eq!(others(&changed), others(&env));
            assert_eq!(changed.get("BOOT_ORDER"), Some(&b"B A"[..]));
        }
    }
});
