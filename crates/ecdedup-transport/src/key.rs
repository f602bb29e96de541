//! The cluster key: the shared secret every chunk server and volume client
//! of one cluster holds, and that the handshake proves.
//!
//! On disk it is one line of hex (16 to 64 bytes of key; `ecdedup` writes
//! 32 random bytes), in a file that other users can neither read nor write:
//! [`ClusterKey::load`] refuses a file with any of the mode bits `0o007`
//! set, as ssh refuses a private key that others can read. The key is never
//! printed (its `Debug` shows only its length).

use std::fmt;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use crate::Error;

/// The shortest key accepted: 128 bits.
pub const KEY_BYTES_MIN: usize = 16;
/// The longest key accepted (HMAC-SHA256's block is 64 bytes).
pub const KEY_BYTES_MAX: usize = 64;
/// The bytes of a key [`ClusterKey::generate`] makes.
pub const KEY_BYTES_GENERATED: usize = 32;
/// Mode bits a key file must not have: any access by other users.
pub const KEY_FILE_MODE_FORBIDDEN: u32 = 0o007;

#[derive(Clone, PartialEq, Eq)]
pub struct ClusterKey {
    bytes: Vec<u8>,
}

impl fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClusterKey({} bytes)", self.bytes.len())
    }
}

impl ClusterKey {
    /// A key from its bytes ([`KEY_BYTES_MIN`] to [`KEY_BYTES_MAX`]).
    pub fn from_bytes(bytes: &[u8]) -> Result<ClusterKey, Error> {
        if !(KEY_BYTES_MIN..=KEY_BYTES_MAX).contains(&bytes.len()) {
            return Err(Error::Key(format!(
                "{} bytes (a key has {KEY_BYTES_MIN} to {KEY_BYTES_MAX})",
                bytes.len()
            )));
        }
        Ok(ClusterKey {
            bytes: bytes.to_vec(),
        })
    }

    /// A new random key of [`KEY_BYTES_GENERATED`] bytes.
    pub fn generate() -> ClusterKey {
        ClusterKey {
            bytes: rand::random::<[u8; KEY_BYTES_GENERATED]>().to_vec(),
        }
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Loads the key file at `path`, refusing one that other users can
    /// read or write, or that does not hold one line of hex of a key's
    /// length.
    pub fn load(path: &Path) -> Result<ClusterKey, Error> {
        let fail = |reason: String| Error::KeyFile {
            path: path.to_path_buf(),
            reason,
        };
        let meta = std::fs::metadata(path).map_err(|e| fail(e.to_string()))?;
        if !meta.is_file() {
            return Err(fail("not a regular file".into()));
        }
        let mode = meta.permissions().mode() & 0o7777;
        if mode & KEY_FILE_MODE_FORBIDDEN != 0 {
            return Err(fail(format!(
                "mode {mode:04o} lets every user of the machine read or write the key; \
                 refusing it (chmod 600 the file)"
            )));
        }
        let text = std::fs::read(path).map_err(|e| fail(e.to_string()))?;
        let text = std::str::from_utf8(&text)
            .map_err(|_| fail("not text (the key is one line of hex)".into()))?;
        let bytes = decode_hex(text.trim()).map_err(fail)?;
        ClusterKey::from_bytes(&bytes).map_err(|e| match e {
            Error::Key(reason) => fail(reason),
            other => other,
        })
    }

    /// Writes the key to a new file at `path`, readable by its owner only
    /// (refuses to overwrite an existing file).
    pub fn write_new(&self, path: &Path) -> Result<(), Error> {
        let fail = |e: std::io::Error| Error::KeyFile {
            path: path.to_path_buf(),
            reason: e.to_string(),
        };
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(fail)?;
        let hex: String = self.bytes.iter().map(|b| format!("{b:02x}")).collect();
        f.write_all(format!("{hex}\n").as_bytes()).map_err(fail)?;
        f.sync_all().map_err(fail)
    }
}

fn decode_hex(text: &str) -> Result<Vec<u8>, String> {
    if !text.len().is_multiple_of(2) {
        return Err(format!(
            "{} hex digits (an odd count; the key is one line of hex)",
            text.len()
        ));
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Ok(c - b'0'),
        b'a'..=b'f' => Ok(c - b'a' + 10),
        b'A'..=b'F' => Ok(c - b'A' + 10),
        _ => Err(format!(
            "{:?} is not a hex digit (the key is one line of hex)",
            c as char
        )),
    };
    text.as_bytes()
        .chunks(2)
        .map(|p| Ok((digit(p[0])? << 4) | digit(p[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_file(dir: &Path, text: &str, mode: u32) -> std::path::PathBuf {
        let path = dir.join("cluster.key");
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    #[test]
    fn a_written_key_loads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        let key = ClusterKey::generate();
        key.write_new(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(ClusterKey::load(&path).unwrap(), key);
        // Never over an existing file.
        assert!(key.write_new(&path).is_err());
    }

    #[test]
    fn a_world_readable_key_file_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let hex = "00112233445566778899aabbccddeeff";
        for mode in [0o644, 0o604, 0o602, 0o601] {
            let err = ClusterKey::load(&key_file(dir.path(), hex, mode)).unwrap_err();
            let msg = err.to_string();
            assert!(
                msg.contains("every user") && msg.contains("chmod 600"),
                "{msg}"
            );
        }
        // Owner-only and group-readable files load.
        assert!(ClusterKey::load(&key_file(dir.path(), hex, 0o600)).is_ok());
        assert!(ClusterKey::load(&key_file(dir.path(), hex, 0o640)).is_ok());
    }

    #[test]
    fn malformed_key_files_are_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        for (text, says) in [
            ("0011", "2 bytes"),
            ("001", "odd count"),
            ("zz112233445566778899aabbccddeeff", "not a hex digit"),
            ("", "0 bytes"),
        ] {
            let msg = ClusterKey::load(&key_file(dir.path(), text, 0o600))
                .unwrap_err()
                .to_string();
            assert!(msg.contains(says), "{text:?}: {msg}");
        }
        let missing = ClusterKey::load(&dir.path().join("absent")).unwrap_err();
        assert!(missing.to_string().contains("absent"), "{missing}");
    }

    #[test]
    fn the_key_is_never_printed() {
        let key = ClusterKey::from_bytes(&[0xab; 16]).unwrap();
        assert_eq!(format!("{key:?}"), "ClusterKey(16 bytes)");
    }
}
