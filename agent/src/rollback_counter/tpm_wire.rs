//! The TPM 2.0 wire format of the three commands the hardware rollback
//! floor needs, as bytes: TPM2_NV_ReadPublic, TPM2_NV_Read and
//! TPM2_NV_Increment, built and their responses parsed from the
//! structures of the TPM 2.0 Library specification (Trusted Computing
//! Group, "Trusted Platform Module Library", Part 2: Structures —
//! TPM_ST, TPM_CC, TPM_RC, TPM_RH/TPM_RS, TPMA_NV with TPM_NT,
//! TPMS_NV_PUBLIC, TPMS_AUTH_COMMAND/RESPONSE; Part 3: Commands — the
//! command and response tables of NV_ReadPublic, NV_Read, NV_Increment;
//! Part 1: Architecture — the authorization area and the response code
//! formats).
//!
//! Why: a device without tpm2-tools (a small rootfs, an initramfs) still
//! has the kernel's `/dev/tpmrm0`; these three commands, with the empty
//! password session, are all the floor uses, a few hundred bytes of code
//! instead of a TPM software stack.
//!
//! Every response is untrusted bytes: each parse checks the header's size
//! against what arrived, every length against what is left, the response
//! tag against the command's, and turns a response code into its name
//! (`TPM_RC_NV_AUTHORIZATION`). This module never does I/O, never builds
//! a command that writes anything but an increment of the one index it
//! is given, and never authorizes with anything but the index's own empty
//! password.

/// TPM_ST_NO_SESSIONS and TPM_ST_SESSIONS (Part 2, TPM_ST).
const ST_NO_SESSIONS: u16 = 0x8001;
const ST_SESSIONS: u16 = 0x8002;
/// TPM_CC values (Part 2, TPM_CC).
pub const CC_NV_INCREMENT: u32 = 0x0000_0134;
pub const CC_NV_READ: u32 = 0x0000_014E;
pub const CC_NV_READ_PUBLIC: u32 = 0x0000_0169;
/// TPM_RS_PW: the password authorization session (Part 2, TPM_RH).
const RS_PW: u32 = 0x4000_0009;
/// A response header: tag, responseSize, responseCode.
pub const HEADER: usize = 10;
/// The largest response accepted; the three answer in under 200 bytes.
pub const MAX_RESPONSE: usize = 4096;
/// TPM_RC_NV_UNINITIALIZED: a counter never incremented.
pub const RC_NV_UNINITIALIZED: u32 = 0x14A;
/// TPM_RC_HANDLE, format 1 (0x080 + 0x00B), as an index not defined
/// answers NV_ReadPublic (with its handle number in bits 8..11).
const RC_HANDLE: u32 = 0x08B;
/// TPM_NT_COUNTER in TPMA_NV bits 7:4.
const NT_COUNTER: u32 = 1;

/// The name of a command code, for messages.
pub fn command_name(cc: u32) -> &'static str {
    match cc {
        CC_NV_INCREMENT => "TPM2_NV_Increment",
        CC_NV_READ => "TPM2_NV_Read",
        CC_NV_READ_PUBLIC => "TPM2_NV_ReadPublic",
        _ => "TPM2 command",
    }
}

/// Header, handles and (with `auth`) a password session authorizing with
/// the empty password, then `params`.
fn command(cc: u32, handles: &[u32], auth: bool, params: &[u8]) -> Vec<u8> {
    let mut c = Vec::with_capacity(64);
    c.extend_from_slice(&if auth { ST_SESSIONS } else { ST_NO_SESSIONS }.to_be_bytes());
    c.extend_from_slice(&[0; 4]);
    c.extend_from_slice(&cc.to_be_bytes());
    for h in handles {
        c.extend_from_slice(&h.to_be_bytes());
    }
    if auth {
        // authorizationSize, then TPMS_AUTH_COMMAND: sessionHandle,
        // nonceCaller (empty TPM2B), sessionAttributes, hmac (empty TPM2B).
        c.extend_from_slice(&9u32.to_be_bytes());
        c.extend_from_slice(&RS_PW.to_be_bytes());
        c.extend_from_slice(&[0, 0, 0, 0, 0]);
    }
    c.extend_from_slice(params);
    let size = c.len() as u32;
    c[2..6].copy_from_slice(&size.to_be_bytes());
    c
}

/// TPM2_NV_ReadPublic of `index` (no authorization).
pub fn nv_read_public(index: u32) -> Vec<u8> {
    command(CC_NV_READ_PUBLIC, &[index], false, &[])
}

/// TPM2_NV_Read of the 8 bytes of counter `index`, authorized by the
/// index itself (TPMA_NV_AUTHREAD).
pub fn nv_read_counter(index: u32) -> Vec<u8> {
    // size (UINT16) 8, offset (UINT16) 0.
    command(CC_NV_READ, &[index, index], true, &[0, 8, 0, 0])
}

/// TPM2_NV_Increment of counter `index`, authorized by the index itself
/// (TPMA_NV_AUTHWRITE).
pub fn nv_increment(index: u32) -> Vec<u8> {
    command(CC_NV_INCREMENT, &[index, index], true, &[])
}

/// What a response said, for the counter's messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireError {
    /// The TPM answered with this response code.
    Code(u32),
    /// The bytes are not a well-formed response to the command.
    Malformed(String),
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::Code(rc) => f.write_str(&rc_text(*rc)),
            WireError::Malformed(why) => write!(f, "malformed response: {why}"),
        }
    }
}

type Parsed<T> = std::result::Result<T, WireError>;

/// A bounds-checked reader over a response's bytes.
struct Cursor<'a> {
    rest: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> Parsed<&'a [u8]> {
        if self.rest.len() < n {
            return Err(WireError::Malformed(format!(
                "{what} needs {n} bytes, {} left",
                self.rest.len()
            )));
        }
        let (a, b) = self.rest.split_at(n);
        self.rest = b;
        Ok(a)
    }
    fn u8(&mut self, what: &str) -> Parsed<u8> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &str) -> Parsed<u16> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self, what: &str) -> Parsed<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    /// A TPM2B: a UINT16 size and that many bytes.
    fn sized(&mut self, what: &str) -> Parsed<&'a [u8]> {
        let n = self.u16(what)?;
        self.take(usize::from(n), what)
    }
    fn end(&self, what: &str) -> Parsed<()> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(WireError::Malformed(format!(
                "{} bytes after {what}",
                self.rest.len()
            )))
        }
    }
}

/// The total size a response header announces, for a transport that
/// reads the rest of it: refused when below the header or above
/// [`MAX_RESPONSE`].
pub fn announced_size(header: &[u8]) -> Parsed<usize> {
    let mut c = Cursor { rest: header };
    c.u16("tag")?;
    let size = c.u32("responseSize")? as usize;
    if !(HEADER..=MAX_RESPONSE).contains(&size) {
        return Err(WireError::Malformed(format!(
            "responseSize {size} outside {HEADER}..{MAX_RESPONSE}"
        )));
    }
    Ok(size)
}

/// The header of `resp` checked: its size is the bytes that came, its
/// code success, its tag the one a command with (`sessions`) or without
/// sessions gets. The bytes after the header.
fn body(resp: &[u8], sessions: bool) -> Parsed<&[u8]> {
    let size = announced_size(resp)?;
    if size != resp.len() {
        return Err(WireError::Malformed(format!(
            "responseSize {size} but {} bytes came",
            resp.len()
        )));
    }
    let mut c = Cursor { rest: resp };
    let tag = c.u16("tag")?;
    c.u32("responseSize")?;
    let rc = c.u32("responseCode")?;
    if rc != 0 {
        return Err(WireError::Code(rc));
    }
    let want = if sessions {
        ST_SESSIONS
    } else {
        ST_NO_SESSIONS
    };
    if tag != want {
        return Err(WireError::Malformed(format!(
            "tag {tag:#06x} where {want:#06x} belongs"
        )));
    }
    Ok(c.rest)
}

/// A response to a command with the password session: parameterSize, the
/// parameters, then one TPMS_AUTH_RESPONSE. The parameters.
fn with_session(resp: &[u8]) -> Parsed<&[u8]> {
    let mut c = Cursor {
        rest: body(resp, true)?,
    };
    let n = c.u32("parameterSize")?;
    let params = c.take(n as usize, "parameters")?;
    c.sized("nonceTPM")?;
    c.u8("sessionAttributes")?;
    c.sized("hmac")?;
    c.end("the authorization area")?;
    Ok(params)
}

/// What TPM2_NV_ReadPublic says of an index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvPublic {
    pub index: u32,
    /// TPMA_NV.
    pub attributes: u32,
    pub data_size: u16,
}

impl NvPublic {
    /// TPM_NT (attributes bits 7:4) is TPM_NT_COUNTER.
    pub fn is_counter(&self) -> bool {
        (self.attributes >> 4) & 0xF == NT_COUNTER
    }
}

/// The TPMS_NV_PUBLIC of a TPM2_NV_ReadPublic response (its name is
/// checked for size, not used).
pub fn parse_read_public(resp: &[u8]) -> Parsed<NvPublic> {
    let mut c = Cursor {
        rest: body(resp, false)?,
    };
    let public = c.sized("nvPublic")?;
    c.sized("nvName")?;
    c.end("nvName")?;
    let mut p = Cursor { rest: public };
    let index = p.u32("nvIndex")?;
    p.u16("nameAlg")?;
    let attributes = p.u32("attributes")?;
    p.sized("authPolicy")?;
    let data_size = p.u16("dataSize")?;
    p.end("nvPublic")?;
    Ok(NvPublic {
        index,
        attributes,
        data_size,
    })
}

/// The counter's value from a TPM2_NV_Read response for 8 bytes.
pub fn parse_read_counter(resp: &[u8]) -> Parsed<u64> {
    let mut c = Cursor {
        rest: with_session(resp)?,
    };
    let data = c.sized("data")?;
    c.end("data")?;
    let b: [u8; 8] = data.try_into().map_err(|_| {
        WireError::Malformed(format!(
            "{} bytes of data where a counter has 8",
            data.len()
        ))
    })?;
    Ok(u64::from_be_bytes(b))
}

/// A TPM2_NV_Increment response (no parameters).
pub fn parse_increment(resp: &[u8]) -> Parsed<()> {
    let params = with_session(resp)?;
    if !params.is_empty() {
        return Err(WireError::Malformed(format!(
            "{} bytes of parameters where none belong",
            params.len()
        )));
    }
    Ok(())
}

/// Whether `rc` asks for the command again (TPM_RC_YIELDED, TPM_RC_TESTING,
/// TPM_RC_RETRY).
pub fn retry(rc: u32) -> bool {
    matches!(rc, 0x908 | 0x90A | 0x922)
}

/// Whether `rc` is TPM_RC_HANDLE on a handle (no such index).
pub fn no_such_handle(rc: u32) -> bool {
    rc & 0x0C0 == 0x080 && rc & 0x800 == 0 && rc & 0x3F == RC_HANDLE & 0x3F
}

/// `rc` by its name from Part 2 (TPM_RC), with the handle, parameter or
/// session it concerns, and its value: `TPM_RC_NV_AUTHORIZATION (0x149)`.
pub fn rc_text(rc: u32) -> String {
    let (name, which) = if rc & 0x080 != 0 {
        // Format 1: error number in bits 5:0, what it concerns above.
        let n = rc & 0x3F;
        let which = if rc & 0x040 != 0 {
            format!(" on parameter {}", (rc >> 8) & 0xF)
        } else if rc & 0x800 != 0 {
            format!(" on session {}", (rc >> 8) & 0x7)
        } else {
            format!(" on handle {}", (rc >> 8) & 0x7)
        };
        (fmt1_name(n), which)
    } else if rc & 0x900 == 0x900 {
        (warn_name(rc & 0x7F), String::new())
    } else if rc & 0x100 != 0 {
        (fmt0_name(rc & 0x7F), String::new())
    } else {
        (None, String::new())
    };
    match name {
        Some(n) => format!("TPM_RC_{n}{which} ({rc:#x})"),
        None => format!("TPM response code {rc:#x}"),
    }
}

fn fmt1_name(n: u32) -> Option<&'static str> {
    Some(match n {
        0x01 => "ASYMMETRIC",
        0x02 => "ATTRIBUTES",
        0x03 => "HASH",
        0x04 => "VALUE",
        0x05 => "HIERARCHY",
        0x07 => "KEY_SIZE",
        0x08 => "MGF",
        0x09 => "MODE",
        0x0A => "TYPE",
        0x0B => "HANDLE",
        0x0C => "KDF",
        0x0D => "RANGE",
        0x0E => "AUTH_FAIL",
        0x0F => "NONCE",
        0x10 => "PP",
        0x12 => "SCHEME",
        0x15 => "SIZE",
        0x16 => "SYMMETRIC",
        0x17 => "TAG",
        0x18 => "SELECTOR",
        0x1A => "INSUFFICIENT",
        0x1B => "SIGNATURE",
        0x1C => "KEY",
        0x1D => "POLICY_FAIL",
        0x1F => "INTEGRITY",
        0x20 => "TICKET",
        0x21 => "RESERVED_BITS",
        0x22 => "BAD_AUTH",
        0x23 => "EXPIRED",
        0x24 => "POLICY_CC",
        0x25 => "BINDING",
        _ => return None,
    })
}

fn fmt0_name(n: u32) -> Option<&'static str> {
    Some(match n {
        0x00 => "INITIALIZE",
        0x01 => "FAILURE",
        0x03 => "SEQUENCE",
        0x19 => "HMAC",
        0x20 => "DISABLED",
        0x21 => "EXCLUSIVE",
        0x24 => "AUTH_TYPE",
        0x25 => "AUTH_MISSING",
        0x26 => "POLICY",
        0x27 => "PCR",
        0x28 => "PCR_CHANGED",
        0x2D => "UPGRADE",
        0x2E => "TOO_MANY_CONTEXTS",
        0x2F => "AUTH_UNAVAILABLE",
        0x30 => "REBOOT",
        0x31 => "UNBALANCED",
        0x42 => "COMMAND_SIZE",
        0x43 => "COMMAND_CODE",
        0x44 => "AUTHSIZE",
        0x45 => "AUTH_CONTEXT",
        0x46 => "NV_RANGE",
        0x47 => "NV_SIZE",
        0x48 => "NV_LOCKED",
        0x49 => "NV_AUTHORIZATION",
        0x4A => "NV_UNINITIALIZED",
        0x4B => "NV_SPACE",
        0x4C => "NV_DEFINED",
        0x50 => "BAD_CONTEXT",
        0x51 => "CPHASH",
        0x52 => "PARENT",
        0x53 => "NEEDS_TEST",
        0x54 => "NO_RESULT",
        0x55 => "SENSITIVE",
        _ => return None,
    })
}

fn warn_name(n: u32) -> Option<&'static str> {
    Some(match n {
        0x01 => "CONTEXT_GAP",
        0x02 => "OBJECT_MEMORY",
        0x03 => "SESSION_MEMORY",
        0x04 => "MEMORY",
        0x05 => "SESSION_HANDLES",
        0x06 => "OBJECT_HANDLES",
        0x07 => "LOCALITY",
        0x08 => "YIELDED",
        0x09 => "CANCELED",
        0x0A => "TESTING",
        0x20 => "NV_RATE",
        0x21 => "LOCKOUT",
        0x22 => "RETRY",
        0x23 => "NV_UNAVAILABLE",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const I: u32 = 0x0150_0016;

    fn resp(tag: u16, rc: u32, body: &[u8]) -> Vec<u8> {
        let mut r = tag.to_be_bytes().to_vec();
        r.extend_from_slice(&((HEADER + body.len()) as u32).to_be_bytes());
        r.extend_from_slice(&rc.to_be_bytes());
        r.extend_from_slice(body);
        r
    }

    /// parameterSize, `params`, an empty TPMS_AUTH_RESPONSE
    /// (continueSession set, as TPM_RS_PW answers).
    fn session_body(params: &[u8]) -> Vec<u8> {
        let mut b = (params.len() as u32).to_be_bytes().to_vec();
        b.extend_from_slice(params);
        b.extend_from_slice(&[0, 0, 1, 0, 0]);
        b
    }

    fn public_body(index: u32, attributes: u32, size: u16) -> Vec<u8> {
        let mut p = index.to_be_bytes().to_vec();
        p.extend_from_slice(&0x000Bu16.to_be_bytes());
        p.extend_from_slice(&attributes.to_be_bytes());
        p.extend_from_slice(&[0, 0]);
        p.extend_from_slice(&size.to_be_bytes());
        let mut b = (p.len() as u16).to_be_bytes().to_vec();
        b.extend_from_slice(&p);
        b.extend_from_slice(&[0, 34]);
        b.extend_from_slice(&[0xAB; 34]);
        b
    }

    #[test]
    fn commands_are_the_bytes_part_3_lays_out() {
        assert_eq!(
            nv_read_public(I),
            [0x80, 0x01, 0, 0, 0, 14, 0, 0, 1, 0x69, 1, 0x50, 0, 0x16]
        );
        let read = nv_read_counter(I);
        assert_eq!(
            read,
            [
                0x80, 0x02, 0, 0, 0, 35, 0, 0, 1, 0x4E, // header
                1, 0x50, 0, 0x16, 1, 0x50, 0, 0x16, // authHandle, nvIndex
                0, 0, 0, 9, 0x40, 0, 0, 9, 0, 0, 0, 0, 0, // TPM_RS_PW, empty
                0, 8, 0, 0, // size 8, offset 0
            ]
        );
        let inc = nv_increment(I);
        assert_eq!(inc.len(), 31);
        assert_eq!(&inc[6..10], &CC_NV_INCREMENT.to_be_bytes());
        assert_eq!(&inc[2..6], &31u32.to_be_bytes());
    }

    #[test]
    fn a_counters_public_area_and_value_are_read() {
        // ownerwrite|authwrite|nt=counter|ownerread|authread|no_da|written
        let p = parse_read_public(&resp(0x8001, 0, &public_body(I, 0x2206_0016, 8))).unwrap();
        assert_eq!((p.index, p.data_size), (I, 8));
        assert!(p.is_counter());
        let ordinary = parse_read_public(&resp(0x8001, 0, &public_body(I, 0x2206_0006, 8)));
        assert!(!ordinary.unwrap().is_counter());
        let bits = parse_read_public(&resp(0x8001, 0, &public_body(I, 0x2206_0026, 8)));
        assert!(!bits.unwrap().is_counter(), "TPM_NT_BITS is not a counter");
        let mut data = vec![0, 8];
        data.extend_from_slice(&7u64.to_be_bytes());
        assert_eq!(
            parse_read_counter(&resp(0x8002, 0, &session_body(&data))),
            Ok(7)
        );
        assert_eq!(
            parse_increment(&resp(0x8002, 0, &session_body(&[]))),
            Ok(())
        );
    }

    #[test]
    fn a_response_code_is_named_with_what_it_concerns() {
        let rows = [
            (0x149, "TPM_RC_NV_AUTHORIZATION (0x149)"),
            (0x14A, "TPM_RC_NV_UNINITIALIZED (0x14a)"),
            (0x18B, "TPM_RC_HANDLE on handle 1 (0x18b)"),
            (0x28B, "TPM_RC_HANDLE on handle 2 (0x28b)"),
            (0x9A2, "TPM_RC_BAD_AUTH on session 1 (0x9a2)"),
            (0x1C4, "TPM_RC_VALUE on parameter 1 (0x1c4)"),
            (0x921, "TPM_RC_LOCKOUT (0x921)"),
            (0x922, "TPM_RC_RETRY (0x922)"),
            (0x101, "TPM_RC_FAILURE (0x101)"),
            (0x100, "TPM_RC_INITIALIZE (0x100)"),
            (0x1E, "TPM response code 0x1e"),
            (0x17F, "TPM response code 0x17f"),
            (0xFFFF_FFFF, "TPM response code 0xffffffff"),
        ];
        for (rc, want) in rows {
            assert!(rc_text(rc).starts_with(want), "{rc:#x}: {}", rc_text(rc));
        }
        assert!(no_such_handle(0x18B) && no_such_handle(0x28B));
        assert!(!no_such_handle(0x14A) && !no_such_handle(0x9A2) && !no_such_handle(0x1CB));
        assert!(retry(0x922) && retry(0x908) && !retry(0x921));
    }

    #[test]
    fn an_error_response_is_its_code_whatever_its_tag() {
        let r = resp(0x8001, 0x149, &[]);
        assert_eq!(parse_increment(&r), Err(WireError::Code(0x149)));
        assert_eq!(parse_read_counter(&r), Err(WireError::Code(0x149)));
        assert_eq!(
            parse_read_public(&resp(0x8001, 0x18B, &[])),
            Err(WireError::Code(0x18B))
        );
    }

    #[test]
    fn hostile_responses_are_refused_with_what_is_wrong() {
        let mut data = vec![0, 8];
        data.extend_from_slice(&7u64.to_be_bytes());
        let good = resp(0x8002, 0, &session_body(&data));
        let mut long_size = good.clone();
        long_size[5] += 1;
        let mut short_size = good.clone();
        short_size[5] -= 1;
        let mut tiny = good.clone();
        tiny[2..6].copy_from_slice(&4u32.to_be_bytes());
        let mut huge = good.clone();
        huge[2..6].copy_from_slice(&u32::MAX.to_be_bytes());
        let mut params_over = good.clone();
        params_over[10..14].copy_from_slice(&1000u32.to_be_bytes());
        let mut seven = vec![0, 7];
        seven.extend_from_slice(&[0; 7]);
        let mut trailing = good.clone();
        trailing.push(0);
        trailing[5] += 1;
        let rows: Vec<(&str, Vec<u8>, &str)> = vec![
            ("empty", vec![], "tag needs 2 bytes, 0 left"),
            (
                "half a header",
                good[..7].to_vec(),
                "responseSize 29 but 7 bytes came",
            ),
            ("size above the bytes", long_size, "but 29 bytes came"),
            ("size below the bytes", short_size, "but 29 bytes came"),
            ("size below a header", tiny, "responseSize 4 outside"),
            (
                "size beyond any response",
                huge,
                "responseSize 4294967295 outside",
            ),
            (
                "wrong tag",
                resp(0x8001, 0, &session_body(&data)),
                "tag 0x8001 where 0x8002",
            ),
            (
                "parameters past the end",
                params_over,
                "parameters needs 1000 bytes",
            ),
            (
                "no session",
                resp(
                    0x8002,
                    0,
                    &(10u32.to_be_bytes())
                        .iter()
                        .chain(&data)
                        .copied()
                        .collect::<Vec<_>>(),
                ),
                "nonceTPM needs 2 bytes",
            ),
            (
                "seven bytes",
                resp(0x8002, 0, &session_body(&seven)),
                "7 bytes of data where a counter has 8",
            ),
            (
                "bytes after the session",
                trailing,
                "1 bytes after the authorization area",
            ),
        ];
        for (what, bytes, want) in rows {
            let e = parse_read_counter(&bytes).unwrap_err().to_string();
            assert!(e.contains(want), "{what}: {e}");
        }
        assert!(
            parse_increment(&good)
                .unwrap_err()
                .to_string()
                .contains("10 bytes of parameters where none belong")
        );
        let mut p = public_body(I, 0x2206_0016, 8);
        p[1] += 3;
        let e = parse_read_public(&resp(0x8001, 0, &p))
            .unwrap_err()
            .to_string();
        assert!(e.contains("nvPublic") || e.contains("nvName"), "{e}");
        let mut p = public_body(I, 0x2206_0016, 8);
        p[1] -= 1;
        assert!(parse_read_public(&resp(0x8001, 0, &p)).is_err());
        // Every prefix of a good response is refused, never a panic.
        for n in 0..good.len() {
            assert!(parse_read_counter(&good[..n]).is_err(), "{n}");
        }
    }

    #[test]
    fn mutated_responses_never_panic_and_never_pass_a_wrong_size() {
        let mut data = vec![0, 8];
        data.extend_from_slice(&7u64.to_be_bytes());
        let seeds = [
            resp(0x8002, 0, &session_body(&data)),
            resp(0x8002, 0, &session_body(&[])),
            resp(0x8001, 0, &public_body(I, 0x2206_0016, 8)),
        ];
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..20_000 {
            let mut r = seeds[(next() % 3) as usize].clone();
            for _ in 0..1 + next() % 4 {
                let i = (next() as usize) % r.len();
                match next() % 3 {
                    0 => r[i] = next() as u8,
                    1 => r.truncate(i),
                    _ => r.insert(i, next() as u8),
                }
                if r.is_empty() {
                    break;
                }
            }
            let agrees = announced_size(&r) == Ok(r.len());
            for ok in [
                parse_read_counter(&r).is_ok(),
                parse_increment(&r).is_ok(),
                parse_read_public(&r).is_ok(),
            ] {
                assert!(!ok || agrees, "{r:02x?}");
            }
        }
    }
}
