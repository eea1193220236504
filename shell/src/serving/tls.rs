//! The serving certificate: `--tls-cert-file` + `--tls-private-key-file` (PEM), or — as
//! kube-controller-manager does without them (`SecureServingOptions.MaybeDefaultWithSelfSignedCerts`)
//! — a self-signed one generated in memory at start-up: a CA and a serving certificate it signs,
//! for `localhost`, `127.0.0.1`, `::1` and a specific `--bind-address`, valid for one year (kcm's
//! `certutil.GenerateSelfSignedCertKey`). Nothing is written to disk, so the root filesystem can
//! stay read-only. Keys are ECDSA P-256 (ring generates no RSA keys); TLS 1.2 and 1.3 with
//! rustls's default cipher suites; ALPN `http/1.1`.
//!
//! Certificate files are re-read every [`RELOAD_INTERVAL`] (kcm's dynamic serving certificate
//! checks its files every minute, `dynamiccertificates` `FileRefreshDuration`): a rotated pair
//! (e.g. by cert-manager) is served from the next handshake on; a pair that does not load (half
//! written, key not matching) is logged and the previous one stays in use.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use super::ServingError;

/// How often the certificate files are checked for a new pair.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(60);

/// Where the serving certificate came from.
#[derive(Debug, Clone)]
pub enum ServingCertificate {
    /// `--tls-cert-file` / `--tls-private-key-file`, re-read by [`CertificateFiles::watch`].
    Files {
        /// The files and the pair currently served.
        files: Arc<CertificateFiles>,
    },
    /// Generated in memory; `ca` (DER) signed the serving certificate, so a client that trusts it
    /// can verify the server.
    SelfSigned {
        /// The CA certificate.
        ca: CertificateDer<'static>,
    },
}

/// The TLS configuration for the secure port, from the files or self-signed (see the module
/// documentation). `bind_ip` is the specific `--bind-address`, if any (added to the self-signed
/// certificate's names).
///
/// # Errors
/// [`ServingError::CertificatePair`] for only one of the two files, `CertificateFile` for an
/// unreadable or empty file, `Tls` when the key does not match the certificate, `SelfSigned` if
/// generation fails.
pub fn server_config(
    cert_file: Option<&Path>,
    key_file: Option<&Path>,
    bind_ip: Option<IpAddr>,
) -> Result<(Arc<ServerConfig>, ServingCertificate), ServingError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(ServingError::Tls)?
        .with_no_client_auth();
    let (mut config, source) = match (cert_file, key_file) {
        (Some(cert), Some(key)) => {
            let files = Arc::new(CertificateFiles::load(cert, key, provider)?);
            (
                builder.with_cert_resolver(files.clone()),
                ServingCertificate::Files { files },
            )
        }
        (None, None) => {
            let (chain, key, ca) = self_signed(bind_ip).map_err(ServingError::SelfSigned)?;
            let config = builder
                .with_single_cert(chain, key)
                .map_err(ServingError::Tls)?;
            (config, ServingCertificate::SelfSigned { ca })
        }
        _ => return Err(ServingError::CertificatePair),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((Arc::new(config), source))
}

/// The certificate files and the pair last loaded from them (served to every handshake).
#[derive(Debug)]
pub struct CertificateFiles {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<CryptoProvider>,
    /// (certificate file bytes, key file bytes, the pair built from them).
    current: RwLock<(Vec<u8>, Vec<u8>, Arc<CertifiedKey>)>,
}

impl CertificateFiles {
    fn load(
        cert: &Path,
        key: &Path,
        provider: Arc<CryptoProvider>,
    ) -> Result<CertificateFiles, ServingError> {
        let (cert_pem, key_pem, pair) = read_pair(cert, key, &provider)?;
        Ok(CertificateFiles {
            cert: cert.to_owned(),
            key: key.to_owned(),
            provider,
            current: RwLock::new((cert_pem, key_pem, Arc::new(pair))),
        })
    }

    /// The pair served now.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .2
            .clone()
    }

    /// Re-reads both files: `Ok(true)` if their contents changed and make a valid pair (served
    /// from the next handshake), `Ok(false)` if unchanged.
    ///
    /// # Errors
    /// The [`ServingError`] of a pair that does not load; the previous pair stays in use.
    pub fn reload(&self) -> Result<bool, ServingError> {
        let cert_pem = std::fs::read(&self.cert).map_err(|e| ServingError::CertificateFile {
            flag: "--tls-cert-file",
            path: self.cert.clone(),
            message: e.to_string(),
        })?;
        let key_pem = std::fs::read(&self.key).map_err(|e| ServingError::CertificateFile {
            flag: "--tls-private-key-file",
            path: self.key.clone(),
            message: e.to_string(),
        })?;
        {
            let current = self.current.read().unwrap_or_else(PoisonError::into_inner);
            if current.0 == cert_pem && current.1 == key_pem {
                return Ok(false);
            }
        }
        let pair = parse_pair(&cert_pem, &key_pem, &self.cert, &self.key, &self.provider)?;
        *self.current.write().unwrap_or_else(PoisonError::into_inner) =
            (cert_pem, key_pem, Arc::new(pair));
        Ok(true)
    }

    /// Calls [`reload`](Self::reload) every `interval`, forever; logs a new pair at info level
    /// and a failure as a warning.
    pub async fn watch(self: Arc<Self>, interval: Duration) {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            ticks.tick().await;
            match self.reload() {
                Ok(true) => {
                    tracing::info!(cert = %self.cert.display(), "secure port: serving the new certificate")
                }
                Ok(false) => {}
                Err(error) => {
                    tracing::warn!(%error, "secure port: the certificate files do not load; still serving the previous pair")
                }
            }
        }
    }
}

impl ResolvesServerCert for CertificateFiles {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

fn read_pair(
    cert: &Path,
    key: &Path,
    provider: &CryptoProvider,
) -> Result<(Vec<u8>, Vec<u8>, CertifiedKey), ServingError> {
    let cert_pem = std::fs::read(cert).map_err(|e| ServingError::CertificateFile {
        flag: "--tls-cert-file",
        path: cert.to_owned(),
        message: e.to_string(),
    })?;
    let key_pem = std::fs::read(key).map_err(|e| ServingError::CertificateFile {
        flag: "--tls-private-key-file",
        path: key.to_owned(),
        message: e.to_string(),
    })?;
    let pair = parse_pair(&cert_pem, &key_pem, cert, key, provider)?;
    Ok((cert_pem, key_pem, pair))
}

/// The pair in two PEM texts; the key must match the first certificate.
fn parse_pair(
    cert_pem: &[u8],
    key_pem: &[u8],
    cert: &Path,
    key: &Path,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, ServingError> {
    let (chain, key_der) = parse_files(cert_pem, key_pem, cert, key)?;
    CertifiedKey::from_der(chain, key_der, provider).map_err(ServingError::Tls)
}

fn parse_files(
    cert_pem: &[u8],
    key_pem: &[u8],
    cert: &Path,
    key: &Path,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), ServingError> {
    let file_error =
        |flag: &'static str, path: &Path, message: String| ServingError::CertificateFile {
            flag,
            path: path.to_owned(),
            message,
        };
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error("--tls-cert-file", cert, format!("not PEM: {e}")))?;
    if chain.is_empty() {
        return Err(file_error(
            "--tls-cert-file",
            cert,
            "holds no CERTIFICATE block".to_owned(),
        ));
    }
    let key_der = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| {
        file_error(
            "--tls-private-key-file",
            key,
            format!("no usable PRIVATE KEY block: {e}"),
        )
    })?;
    Ok((chain, key_der))
}

/// One year, as kcm's self-signed certificates.
const SELF_SIGNED_VALIDITY: time::Duration = time::Duration::days(365);

/// A CA and a serving certificate it signs (chain: serving certificate, CA), the serving key,
/// and the CA certificate.
fn self_signed(
    bind_ip: Option<IpAddr>,
) -> Result<
    (
        Vec<CertificateDer<'static>>,
        PrivateKeyDer<'static>,
        CertificateDer<'static>,
    ),
    rcgen::Error,
> {
    let now = time::OffsetDateTime::now_utc();
    let stamp = now.unix_timestamp();
    // Allow for a clock a little behind ours on the client.
    let not_before = now - time::Duration::hours(1);
    let not_after = now + SELF_SIGNED_VALIDITY;

    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::default();
    ca_params
        .distinguished_name
        .push(DnType::CommonName, format!("localhost-ca@{stamp}"));
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca_params.not_before = not_before;
    ca_params.not_after = not_after;
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let mut names = vec![
        SanType::DnsName("localhost".try_into()?),
        SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        SanType::IpAddress(IpAddr::V6(Ipv6Addr::LOCALHOST)),
    ];
    if let Some(ip) = bind_ip.filter(|ip| !ip.is_loopback()) {
        names.push(SanType::IpAddress(ip));
    }
    let serving_key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::CommonName, format!("localhost@{stamp}"));
    params.subject_alt_names = names;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.not_before = not_before;
    params.not_after = not_after;
    let serving_cert = params.signed_by(&serving_key, &issuer)?;

    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(serving_key.serialize_der()));
    let ca = ca_cert.der().clone();
    Ok((vec![serving_cert.der().clone(), ca.clone()], key, ca))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_signed_certificates_are_generated_in_memory() {
        let (config, source) =
            server_config(None, None, Some("10.1.2.3".parse().expect("ip"))).expect("self-signed");
        assert!(matches!(source, ServingCertificate::SelfSigned { .. }));
        assert_eq!(config.alpn_protocols, vec![b"http/1.1".to_vec()]);
        let (chain, _, ca) = self_signed(None).expect("generates");
        assert_eq!(chain.len(), 2);
        assert_eq!(chain[1], ca);
        assert_ne!(chain[0], ca);
    }

    #[test]
    fn certificate_files_must_come_in_a_matching_pair() {
        let dir = std::env::temp_dir().join(format!("nodeipam-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let pair = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("cert");
        let other = KeyPair::generate().expect("key");
        let cert_file = dir.join("tls.crt");
        let key_file = dir.join("tls.key");
        let other_key_file = dir.join("other.key");
        let empty_file = dir.join("empty.pem");
        std::fs::write(&cert_file, pair.cert.pem()).expect("write");
        std::fs::write(&key_file, pair.signing_key.serialize_pem()).expect("write");
        std::fs::write(&other_key_file, other.serialize_pem()).expect("write");
        std::fs::write(&empty_file, "").expect("write");

        let (_, source) =
            server_config(Some(&cert_file), Some(&key_file), None).expect("a matching pair");
        let ServingCertificate::Files { files } = source else {
            panic!("served from the files");
        };
        assert_eq!(files.current().cert[0], *pair.cert.der());
        assert!(
            !files.reload().expect("unchanged"),
            "same contents: no reload"
        );
        // Rotated: a new pair is served from the next handshake.
        let rotated =
            rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("cert");
        std::fs::write(&cert_file, rotated.cert.pem()).expect("write");
        std::fs::write(&key_file, rotated.signing_key.serialize_pem()).expect("write");
        assert!(files.reload().expect("a valid new pair"));
        assert_eq!(files.current().cert[0], *rotated.cert.der());
        // Half-rotated (certificate without its key): refused, the previous pair stays.
        std::fs::write(&cert_file, pair.cert.pem()).expect("write");
        assert!(matches!(files.reload(), Err(ServingError::Tls(_))));
        assert_eq!(files.current().cert[0], *rotated.cert.der());
        std::fs::write(&key_file, pair.signing_key.serialize_pem()).expect("write");
        assert!(files.reload().expect("the pair is whole again"));
        assert_eq!(files.current().cert[0], *pair.cert.der());

        let mismatch = server_config(Some(&cert_file), Some(&other_key_file), None)
            .expect_err("the key does not match");
        assert!(matches!(mismatch, ServingError::Tls(_)), "{mismatch}");
        assert_eq!(mismatch.exit_code(), 2);

        let only_one = server_config(Some(&cert_file), None, None).expect_err("one file");
        assert!(matches!(only_one, ServingError::CertificatePair));

        let missing = server_config(Some(&dir.join("nope")), Some(&key_file), None)
            .expect_err("missing file");
        assert!(missing.to_string().contains("--tls-cert-file"), "{missing}");

        let empty =
            server_config(Some(&empty_file), Some(&key_file), None).expect_err("no certificate");
        assert!(empty.to_string().contains("no CERTIFICATE"), "{empty}");

        let no_key = server_config(Some(&cert_file), Some(&cert_file), None)
            .expect_err("a certificate is not a key");
        assert!(
            no_key.to_string().contains("--tls-private-key-file"),
            "{no_key}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
