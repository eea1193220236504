//! The test PKI of [`super::RealCluster`], generated at each start (nothing is committed): a CA,
//! kube-apiserver's serving certificate for `127.0.0.1` and `localhost` signed by it, the
//! ServiceAccount token signing key pair, and the static token file.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

use super::{ADMIN_TOKEN, ADMIN_USER, StartError, io};

/// Paths of the written files.
#[derive(Debug, Clone)]
pub struct Files {
    /// The CA certificate (PEM): what clients trust.
    pub ca_cert: PathBuf,
    /// kube-apiserver's serving certificate (PEM), SANs `127.0.0.1` and `localhost`.
    pub serving_cert: PathBuf,
    /// Its private key (PEM, PKCS#8, ECDSA P-256).
    pub serving_key: PathBuf,
    /// ServiceAccount token signing key (PEM, PKCS#8, ECDSA P-256: tokens are ES256).
    pub sa_private_key: PathBuf,
    /// Its public key (PEM, SubjectPublicKeyInfo): how kube-apiserver verifies the tokens.
    pub sa_public_key: PathBuf,
    /// `--token-auth-file`: `token,user,uid,"group,…"` (kube-apiserver's static token CSV).
    pub tokens: PathBuf,
}

/// Generates the PKI and writes it under `dir/pki`.
///
/// # Errors
/// [`StartError::Pki`] if a key or certificate cannot be generated, [`StartError::Io`] if a file
/// cannot be written.
pub fn write(dir: &Path) -> Result<Files, StartError> {
    let pki = dir.join("pki");
    std::fs::create_dir_all(&pki).map_err(io(format!("creating {}", pki.display())))?;
    let put = |name: &str, text: &str| -> Result<PathBuf, StartError> {
        let path = pki.join(name);
        std::fs::write(&path, text).map_err(io(format!("writing {}", path.display())))?;
        Ok(path)
    };

    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "nodeipam real-apiserver test CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let ca = Issuer::new(ca_params, ca_key);

    let serving_key = KeyPair::generate()?;
    let mut serving_params =
        CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])?;
    serving_params
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    let serving_cert = serving_params.signed_by(&serving_key, &ca)?;

    let sa_key = KeyPair::generate()?;

    Ok(Files {
        ca_cert: put("ca.crt", &ca_cert.pem())?,
        serving_cert: put("apiserver.crt", &serving_cert.pem())?,
        serving_key: put("apiserver.key", &serving_key.serialize_pem())?,
        sa_private_key: put("sa.key", &sa_key.serialize_pem())?,
        sa_public_key: put("sa.pub", &sa_key.public_key_pem())?,
        tokens: put(
            "tokens.csv",
            &format!("{ADMIN_TOKEN},{ADMIN_USER},{ADMIN_USER},\"system:masters\"\n"),
        )?,
    })
}
