//! TLS to etcd (docs/cluster.md, "Security"): the options every process
//! that talks to etcd takes (`--etcd-ca`, `--etcd-cert`, `--etcd-key`;
//! the nbdkit plugin's `etcd_ca=`, `etcd_cert=`, `etcd_key=`), checked
//! once, before any connection, into etcd-client's [`TlsOptions`].
//!
//! The rules, each refused with a message naming the option or the file:
//! - an `https://` endpoint needs a CA file (etcd's server certificate is
//!   verified against it, never against the system's roots);
//! - TLS options with an `http://` endpoint are refused (etcd-client would
//!   refuse them less clearly; a mix of both would send the client key's
//!   proof in the clear to some members and not others);
//! - a client certificate goes with its key, both or neither;
//! - every file must be readable and hold what it is for: PEM
//!   certificates (the CA, the client's chain) or one PEM private key.
//!
//! An endpoint with no scheme gets `https://` when a CA is given, else
//! `http://` (etcd-client's own rule).

use crate::error::{Error, Result};
use etcd_client::{Certificate, Identity, TlsOptions};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};

/// The PEM files of TLS to etcd; all `None`: plain HTTP.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EtcdTls {
    /// The CA that signed etcd's server certificates.
    pub ca: Option<PathBuf>,
    /// This process's client certificate (chain), for an etcd started
    /// with `--client-cert-auth`.
    pub cert: Option<PathBuf>,
    /// The client certificate's private key.
    pub key: Option<PathBuf>,
}

impl EtcdTls {
    /// Whether any option is given.
    pub fn is_set(&self) -> bool {
        self.ca.is_some() || self.cert.is_some() || self.key.is_some()
    }

    /// Checks the options against `endpoints` and loads the files: `None`
    /// for plain HTTP.
    pub fn load(&self, endpoints: &[String]) -> Result<Option<TlsOptions>> {
        let https = endpoints.iter().find(|e| e.starts_with("https://"));
        let http = endpoints.iter().find(|e| e.starts_with("http://"));
        let Some(ca) = &self.ca else {
            if let Some(endpoint) = https {
                return Err(Error::invalid(
                    "etcd TLS",
                    format!(
                        "endpoint {endpoint} is https:// and no CA file is given \
                         (--etcd-ca): etcd's certificate cannot be verified"
                    ),
                ));
            }
            if self.is_set() {
                return Err(Error::invalid(
                    "etcd TLS",
                    "a client certificate or key without a CA file (--etcd-ca)",
                ));
            }
            return Ok(None);
        };
        if let Some(endpoint) = http {
            return Err(Error::invalid(
                "etcd TLS",
                format!(
                    "a CA file is given and endpoint {endpoint} is plain http://: use https://"
                ),
            ));
        }
        let ca = Certificate::from_pem(read_certificates(ca)?);
        let mut options = TlsOptions::new().ca_certificate(ca);
        match (&self.cert, &self.key) {
            (None, None) => {}
            (Some(cert), Some(key)) => {
                let identity = Identity::from_pem(read_certificates(cert)?, read_key(key)?);
                options = options.identity(identity);
            }
            (Some(_), None) | (None, Some(_)) => {
                return Err(Error::invalid(
                    "etcd TLS",
                    "a client certificate and its key go together: give both --etcd-cert \
                     and --etcd-key, or neither",
                ))
            }
        }
        Ok(Some(options))
    }
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| tls_file(path, format!("cannot be read: {e}")))
}

fn tls_file(path: &Path, reason: String) -> Error {
    Error::TlsFile {
        path: path.display().to_string(),
        reason,
    }
}

/// The file's bytes, once they parse as one or more PEM certificates.
fn read_certificates(path: &Path) -> Result<Vec<u8>> {
    let pem = read(path)?;
    let mut count = 0;
    for cert in CertificateDer::pem_slice_iter(&pem) {
        cert.map_err(|e| tls_file(path, format!("is not valid PEM: {e}")))?;
        count += 1;
    }
    if count == 0 {
        return Err(tls_file(
            path,
            "holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into(),
        ));
    }
    Ok(pem)
}

/// The file's bytes, once they parse as a PEM private key.
fn read_key(path: &Path) -> Result<Vec<u8>> {
    let pem = read(path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        tls_file(
            path,
            format!("holds no PEM private key (PKCS#8, PKCS#1 or SEC1): {e}"),
        )
    })?;
    Ok(pem)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed certificate (P-256, made with openssl once; only
    /// parsed here, never used to connect).
    const CERT: &str = "-----BEGIN CERTIFICATE-----
MIIBcjCCARmgAwIBAgIUDspNNi8Md+f5HvypOum6KVYFkoQwCgYIKoZIzj0EAwIw
DzENMAsGA1UEAwwEdGVzdDAeFw0yNjExMjYxODM1MzNaFw0zNjExMjMxODM1MzNa
MA8xDTALBgNVBAMMBHRlc3QwWTATBgcqhkjOPQIBBggqhkjOPQMBBwNCAAQ3RVyU
TmDMrCjObPKZAr39xtAEGnL0uX4+6fCp8fCJT9p1uwa9O5jErDvTxTdxMPtg+ri0
lIMeS0pLtoQpWc9Lo1MwUTAdBgNVHQ4EFgQUqdIVzJ/HbFu7ALhj8dI/8II6I5Qw
HwYDVR0jBBgwFoAUqdIVzJ/HbFu7ALhj8dI/8II6I5QwDwYDVR0TAQH/BAUwAwEB
/zAKBggqhkjOPQQDAgNHADBEAiAeutB6QJ8NAGIJaLIPfsYA8oynL6xdOAFn11y4
p1BAWAIgbtAsnBQhrFGLAmstMcI0XFu+wxFf67p39sPPreEkxLc=
-----END CERTIFICATE-----
";

    fn file(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn https() -> Vec<String> {
        vec!["https://127.0.0.1:2379".into()]
    }

    #[test]
    fn plain_http_needs_no_option_and_https_needs_a_ca() {
        let none = EtcdTls::default();
        assert!(none
            .load(&["http://127.0.0.1:2379".into()])
            .unwrap()
            .is_none());
        let e = none.load(&https()).unwrap_err().to_string();
        assert!(
            e.contains("https://127.0.0.1:2379") && e.contains("--etcd-ca"),
            "{e}"
        );
    }

    #[test]
    fn a_ca_with_an_http_endpoint_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let tls = EtcdTls {
            ca: Some(file(dir.path(), "ca.pem", CERT)),
            ..EtcdTls::default()
        };
        let e = tls
            .load(&["https://a:1".into(), "http://b:2".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("http://b:2"), "{e}");
        assert!(tls.load(&https()).unwrap().is_some());
    }

    #[test]
    fn a_certificate_without_its_key_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ca = file(dir.path(), "ca.pem", CERT);
        let tls = EtcdTls {
            ca: Some(ca.clone()),
            cert: Some(ca),
            key: None,
        };
        let e = tls.load(&https()).unwrap_err().to_string();
        assert!(e.contains("--etcd-key"), "{e}");
    }

    #[test]
    fn a_missing_or_malformed_file_is_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let ca = file(dir.path(), "ca.pem", CERT);
        let missing = dir.path().join("nowhere.pem");
        let garbage = file(dir.path(), "garbage.pem", "not a certificate\n");
        let broken = file(
            dir.path(),
            "broken.pem",
            "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
        );
        let cases = [
            (missing.clone(), None, "cannot be read"),
            (garbage.clone(), None, "no PEM certificate"),
            (broken.clone(), None, "not valid PEM"),
            // A certificate where the key should be.
            (ca.clone(), Some(ca.clone()), "no PEM private key"),
        ];
        for (bad, key_bad, why) in cases {
            let tls = match key_bad {
                None => EtcdTls {
                    ca: Some(bad.clone()),
                    ..EtcdTls::default()
                },
                Some(key) => EtcdTls {
                    ca: Some(ca.clone()),
                    cert: Some(ca.clone()),
                    key: Some(key),
                },
            };
            let e = tls.load(&https()).unwrap_err().to_string();
            assert!(e.contains(&bad.display().to_string()), "{e}");
            assert!(e.contains(why), "{why}: {e}");
        }
    }
}
