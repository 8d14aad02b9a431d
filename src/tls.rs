//! TLS with rustls and the ring provider only.
//!
//! Without a configured certificate the appliance generates, once, a local
//! CA and a server certificate it signs (SANs: localhost, 127.0.0.1, ::1,
//! the host name and `tls.extra_names`), kept in `<data_dir>/tls` with the
//! keys readable by the owner only, and reused on every start. Clients
//! either trust `tls/ca.pem` (curl `--cacert`, browsers) or pin the server
//! certificate's SHA-256 fingerprint, which is logged at start, shown in
//! the console and written to `run/appliance.json` ([`pinned_client_config`]).

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use chrono::Datelike;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use sha2::{Digest, Sha256};

use crate::config::TlsConfig;
use crate::store::datadir::{write_private, write_public};

/// A TLS problem, with the file or setting named.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or written.
    #[error("{0}")]
    File(String),
    /// The certificate or key is unusable.
    #[error("{0}")]
    Invalid(String),
}

/// What the server presents.
#[derive(Clone)]
pub struct TlsMaterial {
    /// rustls server configuration, ALPN h2 and http/1.1.
    pub server_config: Arc<rustls::ServerConfig>,
    /// `sha256:<hex>` of the leaf certificate.
    pub fingerprint: String,
    /// The generated CA certificate (PEM), when the certificate is generated.
    pub ca_pem: Option<String>,
    /// `sha256:<hex>` of the generated CA certificate.
    pub ca_fingerprint: Option<String>,
}

/// Installs ring as the process-wide rustls provider (idempotent).
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// `sha256:<hex>` of DER bytes.
pub fn fingerprint(der: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(der)))
}

/// Loads the configured certificate, or the generated one (creating it on
/// first start).
pub fn load_or_generate(config: &TlsConfig, tls_dir: &Path) -> Result<TlsMaterial, TlsError> {
    install_crypto_provider();
    let (chain, key, ca_pem) = match (&config.cert, &config.key) {
        (Some(cert), Some(key)) => (read_chain(cert)?, read_key(key)?, None),
        _ => {
            let cert_path = tls_dir.join("server.pem");
            let key_path = tls_dir.join("server.key");
            let ca_path = tls_dir.join("ca.pem");
            if !cert_path.exists() || !key_path.exists() {
                generate(tls_dir, &config.extra_names)?;
            }
            let ca = std::fs::read_to_string(&ca_path)
                .map_err(|e| TlsError::File(format!("cannot read {}: {e}", ca_path.display())))?;
            (read_chain(&cert_path)?, read_key(&key_path)?, Some(ca))
        }
    };
    let fingerprint = fingerprint(chain[0].as_ref());
    let ca_fingerprint = ca_pem.as_deref().and_then(|pem| {
        CertificateDer::from_pem_slice(pem.as_bytes())
            .ok()
            .map(|der| self::fingerprint(der.as_ref()))
    });
    let mut server_config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| {
            TlsError::Invalid(format!(
                "certificate and key do not form a usable pair: {e}"
            ))
        })?;
    server_config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsMaterial {
        server_config: Arc::new(server_config),
        fingerprint,
        ca_pem,
        ca_fingerprint,
    })
}

fn read_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| TlsError::File(format!("tls.cert: cannot read {}: {e}", path.display())))?
        .collect::<Result<_, _>>()
        .map_err(|e| {
            TlsError::Invalid(format!(
                "tls.cert: {} is not PEM certificates: {e}",
                path.display()
            ))
        })?;
    if chain.is_empty() {
        return Err(TlsError::Invalid(format!(
            "tls.cert: {} holds no certificate",
            path.display()
        )));
    }
    Ok(chain)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| {
        TlsError::Invalid(format!(
            "tls.key: {} holds no usable private key: {e}",
            path.display()
        ))
    })
}

/// Generates the local CA and the server certificate into `tls_dir`.
fn generate(tls_dir: &Path, extra_names: &[String]) -> Result<(), TlsError> {
    use rcgen::{
        BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose,
        IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
    };
    let invalid = |e: rcgen::Error| TlsError::Invalid(format!("generating the certificate: {e}"));
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    let year = chrono::Utc::now().year();

    let ca_key = KeyPair::generate().map_err(invalid)?;
    let mut ca = CertificateParams::default();
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "agentbay");
    dn.push(DnType::CommonName, format!("agentbay local CA ({host})"));
    ca.distinguished_name = dn;
    ca.not_before = rcgen::date_time_ymd(year - 1, 1, 1);
    ca.not_after = rcgen::date_time_ymd(year + 20, 1, 1);
    let ca_cert = ca.self_signed(&ca_key).map_err(invalid)?;

    let mut names = vec!["localhost".to_string()];
    if !host.is_empty() && host != "localhost" {
        names.push(host.clone());
    }
    let mut leaf = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "agentbay");
    dn.push(DnType::CommonName, format!("agentbay appliance ({host})"));
    leaf.distinguished_name = dn;
    for name in names.iter().chain(extra_names.iter()) {
        let san = match name.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(name.clone().try_into().map_err(|e| {
                TlsError::Invalid(format!("tls.extra_names: {name:?} is not a DNS name: {e}"))
            })?),
        };
        leaf.subject_alt_names.push(san);
    }
    for ip in ["127.0.0.1", "::1"] {
        leaf.subject_alt_names
            .push(SanType::IpAddress(ip.parse().expect("literal IP")));
    }
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.not_before = rcgen::date_time_ymd(year - 1, 1, 1);
    leaf.not_after = rcgen::date_time_ymd(year + 10, 1, 1);
    let leaf_key = KeyPair::generate().map_err(invalid)?;
    let issuer = Issuer::new(ca, ca_key);
    let leaf_cert = leaf.signed_by(&leaf_key, &issuer).map_err(invalid)?;

    let write = |name: &str, data: &str| {
        write_private(&tls_dir.join(name), data.as_bytes())
            .map_err(|e| TlsError::File(e.to_string()))
    };
    // The CA certificate is public: clients need it to trust the appliance.
    write_public(&tls_dir.join("ca.pem"), ca_cert.pem().as_bytes())
        .map_err(|e| TlsError::File(e.to_string()))?;
    write("ca.key", &issuer.key().serialize_pem())?;
    write("server.key", &leaf_key.serialize_pem())?;
    // The chain: leaf first, then the CA, so clients that trust ca.pem can
    // build the path from what the server sends.
    write(
        "server.pem",
        &format!("{}{}", leaf_cert.pem(), ca_cert.pem()),
    )?;
    tracing::info!(dir = %tls_dir.display(), "generated a local CA and server certificate");
    Ok(())
}

/// Files of the TLS directory that a backup carries.
pub fn backup_files(tls_dir: &Path) -> Vec<(String, Vec<u8>)> {
    ["ca.pem", "ca.key", "server.pem", "server.key"]
        .iter()
        .filter_map(|name| {
            std::fs::read(tls_dir.join(name))
                .ok()
                .map(|bytes| (format!("tls/{name}"), bytes))
        })
        .collect()
}

/// A client configuration that accepts exactly one server certificate, by
/// its SHA-256 fingerprint. Used by the CLI against its own appliance and by
/// tests; the fingerprint comes from `run/appliance.json` or the start log.
pub fn pinned_client_config(fingerprint: &str) -> rustls::ClientConfig {
    install_crypto_provider();
    let provider = rustls::crypto::ring::default_provider();
    let verifier = Arc::new(PinnedVerifier {
        fingerprint: fingerprint.to_string(),
        algorithms: provider.signature_verification_algorithms,
    });
    // No ALPN here: HTTP clients set it for the versions they enable.
    rustls::ClientConfig::builder()
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth()
}

#[derive(Debug)]
struct PinnedVerifier {
    fingerprint: String,
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl rustls::client::danger::ServerCertVerifier for PinnedVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        // The pin is the whole trust decision: names and dates do not matter
        // for a certificate identified by its hash.
        if fingerprint(end_entity.as_ref()) == self.fingerprint {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(format!(
                "the server certificate {} is not the pinned {}",
                fingerprint(end_entity.as_ref()),
                self.fingerprint
            )))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// What clients need to know of the served certificate.
#[derive(Clone, Debug)]
pub struct TlsInfo {
    /// `sha256:<hex>` of the server certificate.
    pub fingerprint: String,
    /// `sha256:<hex>` of the generated local CA, if the certificate is
    /// generated.
    pub ca_fingerprint: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_material_is_kept_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let tls = dir.path().join("tls");
        let first = load_or_generate(&TlsConfig::default(), &tls).unwrap();
        let second = load_or_generate(&TlsConfig::default(), &tls).unwrap();
        assert_eq!(first.fingerprint, second.fingerprint);
        assert!(first.fingerprint.starts_with("sha256:"));
        assert_eq!(first.fingerprint.len(), "sha256:".len() + 64);
        assert!(first.ca_pem.is_some());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            for key in ["ca.key", "server.key"] {
                let mode = std::fs::metadata(tls.join(key))
                    .unwrap()
                    .permissions()
                    .mode()
                    & 0o777;
                assert_eq!(mode, 0o600, "{key}");
            }
        }
    }

    #[test]
    fn configured_files_that_do_not_exist_are_named() {
        let config = TlsConfig {
            cert: Some("/nonexistent/cert.pem".into()),
            key: Some("/nonexistent/key.pem".into()),
            extra_names: vec![],
        };
        let err = load_or_generate(&config, Path::new("/tmp")).err().unwrap();
        assert!(err.to_string().contains("/nonexistent/cert.pem"), "{err}");
    }
}
