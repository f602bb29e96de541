//! `cluster up --etcd-tls`: the certificates of a cluster on one machine,
//! made in process with `rcgen` (README, dependencies): a CA, etcd's
//! server certificate (SAN 127.0.0.1, ::1 and localhost, server auth),
//! its peer certificate (the same names, server and client auth, common
//! name [`PEER_COMMON_NAME`]: its peer port takes TLS and only that name)
//! and one client certificate (client auth) that every process `cluster
//! up` starts presents to etcd. All four keys are P-256; the certificates
//! are valid for ten years from January 1st of the year made.
//!
//! The CA's private key is never written: nothing can sign another
//! certificate for this cluster later (a new `cluster up` makes new
//! ones). The three private keys written are created mode 0600.

use crate::error::{Error, Result};
use ecdedup_cluster::{EtcdTls, PeerTls, ServerTls, PEER_COMMON_NAME};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Valid from January 1st of this year for ten years (a trial cluster's
/// life; rcgen's default would never expire).
fn set_validity(params: &mut CertificateParams) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    // Mean Gregorian year: off by at most a day at a year's edge, and
    // January 1st is then still in the past.
    let year = 1970 + (now / 31_556_952) as i32;
    params.not_before = rcgen::date_time_ymd(year, 1, 1);
    params.not_after = rcgen::date_time_ymd(year + 10, 1, 1);
}

/// What [`make`] wrote: etcd's side and the clients' side.
pub struct LocalPki {
    pub server: ServerTls,
    pub client: EtcdTls,
}

fn pki_error(what: &str, e: rcgen::Error) -> Error {
    Error::Other(format!("making the etcd TLS certificates: {what}: {e}"))
}

/// Writes `text` to `path`, replacing it; `secret`: mode 0600 from the
/// start (never readable by others, not even for a moment).
fn write_file(path: &Path, text: &str, secret: bool) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if secret { 0o600 } else { 0o644 })
        .open(path)
        .map_err(|e| Error::io(format!("creating {}", path.display()), e))?;
    if secret {
        // The umask can only take bits away; this states the mode.
        f.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(|e| Error::io(format!("chmod 0600 {}", path.display()), e))?;
    }
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

/// A leaf certificate for `names` signed by `issuer`, with `usage`, its
/// common name `common`; writes `NAME.pem` and `NAME.key` in `dir`.
fn leaf(
    dir: &Path,
    (name, common): (&str, &str),
    names: &[&str],
    usage: &[ExtendedKeyUsagePurpose],
    issuer: &Issuer<'_, KeyPair>,
) -> Result<(PathBuf, PathBuf)> {
    let mut params =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .map_err(|e| pki_error(name, e))?;
    params.distinguished_name.push(DnType::CommonName, common);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = usage.to_vec();
    params.use_authority_key_identifier_extension = true;
    set_validity(&mut params);
    let key = KeyPair::generate().map_err(|e| pki_error(name, e))?;
    let cert = params
        .signed_by(&key, issuer)
        .map_err(|e| pki_error(name, e))?;
    let (pem, key_path) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}.key")),
    );
    write_file(&key_path, &key.serialize_pem(), true)?;
    write_file(&pem, &cert.pem(), false)?;
    Ok((pem, key_path))
}

/// Makes a new CA, etcd's certificates and a client certificate in `dir`
/// (`ca.pem`, `etcd.pem`, `etcd.key`, `etcd-peer.pem`, `etcd-peer.key`,
/// `client.pem`, `client.key`), replacing any there.
pub fn make(dir: &Path) -> Result<LocalPki> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let mut params =
        CertificateParams::new(Vec::<String>::new()).map_err(|e| pki_error("CA", e))?;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params
        .distinguished_name
        .push(DnType::CommonName, "ecdedup cluster up CA");
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    set_validity(&mut params);
    let ca_key = KeyPair::generate().map_err(|e| pki_error("CA", e))?;
    let ca = params
        .self_signed(&ca_key)
        .map_err(|e| pki_error("CA", e))?;
    let ca_path = dir.join("ca.pem");
    write_file(&ca_path, &ca.pem(), false)?;
    let issuer = Issuer::new(params, ca_key);
    let etcd_names = ["127.0.0.1", "::1", "localhost"];
    let (cert, key) = leaf(
        dir,
        ("etcd", "etcd"),
        &etcd_names,
        &[ExtendedKeyUsagePurpose::ServerAuth],
        &issuer,
    )?;
    let (peer_cert, peer_key) = leaf(
        dir,
        ("etcd-peer", PEER_COMMON_NAME),
        &etcd_names,
        &[
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
        &issuer,
    )?;
    let server = ServerTls {
        cert,
        key,
        client_ca: ca_path.clone(),
        peer: Some(PeerTls {
            cert: peer_cert,
            key: peer_key,
        }),
    };
    let (cert, key) = leaf(
        dir,
        ("client", "client"),
        &["ecdedup-client"],
        &[ExtendedKeyUsagePurpose::ClientAuth],
        &issuer,
    )?;
    Ok(LocalPki {
        server,
        client: EtcdTls {
            ca: Some(ca_path),
            cert: Some(cert),
            key: Some(key),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_private_keys_are_0600_and_the_files_parse() {
        let tmp = tempfile::tempdir().unwrap();
        let pki = make(tmp.path()).unwrap();
        for key in [&pki.server.key, pki.client.key.as_ref().unwrap()] {
            let mode = std::fs::metadata(key).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{}", key.display());
        }
        assert!(!tmp.path().join("ca.key").exists(), "the CA key is kept");
        // The client side passes the checks every command makes.
        let loaded = pki.client.load(&["https://127.0.0.1:1".into()]).unwrap();
        assert!(loaded.is_some());
    }
}
