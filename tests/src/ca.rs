//! Test certificate authorities and the server certificates they issue.
//!
//! A [`TestCa`] is a fresh self-signed ECDSA P-256 root made in the test
//! process; it issues leaf certificates for loopback names (`127.0.0.1` as
//! an IP SAN, `localhost` as a DNS SAN) that nginx serves and that updraft
//! verifies through its `ca_file`. A second, independent `TestCa` is the
//! "untrusted CA": same shape, different key, so a client that trusts only
//! the first one must refuse it.
//!
//! Files are written as PEM: the CA certificate, the leaf chain (leaf first,
//! then the CA) and the leaf's PKCS#8 key (mode 0600).
//!
//! This module must never touch the system trust store or any file outside
//! the directory it is given, and never reuse a key across CAs.

use std::fs;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// The names a loopback server certificate covers.
pub const LOOPBACK_NAMES: &[&str] = &["127.0.0.1", "localhost"];

/// A certificate authority that exists only for the test that made it.
pub struct TestCa {
    name: String,
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A leaf certificate issued by a [`TestCa`], with its private key.
#[derive(Clone, Debug)]
pub struct Leaf {
    /// The leaf certificate followed by the issuing CA certificate, PEM.
    pub chain_pem: String,
    /// The leaf's private key, PKCS#8 PEM.
    pub key_pem: String,
    /// The subject alternative names the leaf was issued for.
    pub names: Vec<String>,
}

/// PEM files for one TLS server, as written by [`TestCa::write_server_files`].
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// The CA certificate a client must trust.
    pub ca_cert: PathBuf,
    /// Leaf certificate then CA certificate (nginx `ssl_certificate`).
    pub chain: PathBuf,
    /// The leaf key (nginx `ssl_certificate_key`).
    pub key: PathBuf,
}

fn cert_err(what: &str, e: rcgen::Error) -> io::Error {
    io::Error::other(format!("{what}: {e}"))
}

impl TestCa {
    /// Make a new root CA whose subject common name is `name`.
    pub fn new(name: &str) -> io::Result<TestCa> {
        let key = KeyPair::generate()
            .map_err(|e| cert_err(&format!("generating the key of test CA {name:?}"), e))?;
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        params
            .distinguished_name
            .push(DnType::OrganizationName, "updraft tests");
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let now = SystemTime::now();
        params.not_before = (now - Duration::from_secs(24 * 3600)).into();
        params.not_after = (now + Duration::from_secs(10 * 365 * 24 * 3600)).into();
        let issuer = CertifiedIssuer::self_signed(params, key)
            .map_err(|e| cert_err(&format!("self-signing test CA {name:?}"), e))?;
        Ok(TestCa {
            name: name.to_string(),
            issuer,
        })
    }

    /// The subject common name given to [`TestCa::new`].
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    /// The CA certificate, DER.
    pub fn cert_der(&self) -> Vec<u8> {
        self.issuer.der().to_vec()
    }

    /// Write the CA certificate as PEM to `path`.
    pub fn write_cert(&self, path: &Path) -> io::Result<()> {
        fs::write(path, self.cert_pem()).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("writing test CA {:?} to {}: {e}", self.name, path.display()),
            )
        })
    }

    /// Issue a server certificate for `names` (IP literals become IP SANs,
    /// anything else DNS SANs), valid from a day ago for thirty days.
    pub fn issue(&self, names: &[&str]) -> io::Result<Leaf> {
        let now = SystemTime::now();
        self.issue_valid(
            names,
            now - Duration::from_secs(24 * 3600),
            now + Duration::from_secs(30 * 24 * 3600),
        )
    }

    /// Issue a server certificate for [`LOOPBACK_NAMES`].
    pub fn issue_loopback(&self) -> io::Result<Leaf> {
        self.issue(LOOPBACK_NAMES)
    }

    /// Issue a client certificate (device identity for mTLS) whose common
    /// name is `device`.
    pub fn issue_client(&self, device: &str) -> io::Result<Leaf> {
        let now = SystemTime::now();
        self.issue_with(
            &[device],
            now - Duration::from_secs(24 * 3600),
            now + Duration::from_secs(30 * 24 * 3600),
            ExtendedKeyUsagePurpose::ClientAuth,
        )
    }

    /// Issue a server certificate for `names` valid only between
    /// `not_before` and `not_after` (for expired or not-yet-valid cases).
    pub fn issue_valid(
        &self,
        names: &[&str],
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> io::Result<Leaf> {
        self.issue_with(
            names,
            not_before,
            not_after,
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    fn issue_with(
        &self,
        names: &[&str],
        not_before: SystemTime,
        not_after: SystemTime,
        usage: ExtendedKeyUsagePurpose,
    ) -> io::Result<Leaf> {
        let what = format!(
            "issuing a certificate for {names:?} from test CA {:?}",
            self.name
        );
        let owned: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(owned.clone()).map_err(|e| cert_err(&what, e))?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(
            DnType::CommonName,
            names.first().copied().unwrap_or("updraft test server"),
        );
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![usage];
        params.use_authority_key_identifier_extension = true;
        params.not_before = not_before.into();
        params.not_after = not_after.into();
        let key = KeyPair::generate().map_err(|e| cert_err(&what, e))?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| cert_err(&what, e))?;
        Ok(Leaf {
            chain_pem: format!("{}{}", cert.pem(), self.cert_pem()),
            key_pem: key.serialize_pem(),
            names: owned,
        })
    }

    /// Issue a loopback server certificate and write `<stem>-ca.pem`,
    /// `<stem>.crt` (chain) and `<stem>.key` into `dir`.
    pub fn write_server_files(&self, dir: &Path, stem: &str) -> io::Result<TlsFiles> {
        let leaf = self.issue_loopback()?;
        let ca_cert = dir.join(format!("{stem}-ca.pem"));
        self.write_cert(&ca_cert)?;
        let (chain, key) = leaf.write(dir, stem)?;
        Ok(TlsFiles {
            ca_cert,
            chain,
            key,
        })
    }
}

impl Leaf {
    /// Write `<stem>.crt` (chain) and `<stem>.key` (mode 0600) into `dir`;
    /// returns their paths.
    pub fn write(&self, dir: &Path, stem: &str) -> io::Result<(PathBuf, PathBuf)> {
        let chain = dir.join(format!("{stem}.crt"));
        let key = dir.join(format!("{stem}.key"));
        let ctx = |path: &Path, e: io::Error| {
            io::Error::new(e.kind(), format!("writing {}: {e}", path.display()))
        };
        fs::write(&chain, &self.chain_pem).map_err(|e| ctx(&chain, e))?;
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&key)
            .map_err(|e| ctx(&key, e))?;
        io::Write::write_all(&mut f, self.key_pem.as_bytes()).map_err(|e| ctx(&key, e))?;
        Ok((chain, key))
    }
}
