//! The archive's JSON metadata files (`archive.json`, `catalog.json` and
//! their copies on the devices) with a checksum of their content.
//!
//! A file is the JSON object of its value plus one key, `crc32c`: the
//! CRC-32C of the compact JSON (keys sorted, no white space) of the object
//! without that key. The file itself is written pretty-printed; the
//! checksum covers the content, not the layout, so it is recomputed from
//! the parsed object on read. Each of these files also carries a
//! `generation` (the value's own field), which grows with every rewrite
//! of a changed content.
//!
//! Invariant: a file whose checksum fails, or that does not parse, is
//! [`Checked::Bad`] and is never used or copied; the caller takes another
//! copy. A file without `crc32c` is [`Checked::Legacy`]: written before
//! checksums existed, believed only while the archive's config is itself
//! such a file (an archive not yet opened by a binary that checksums), and
//! rewritten with its checksum at that open.

use super::disk::Disk;
use ecdedup_core::error::Result;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::path::Path;

/// The key that holds the checksum.
const CHECKSUM_KEY: &str = "crc32c";

/// What a metadata file holds.
#[derive(Debug)]
pub enum Checked<T> {
    Missing,
    /// Its checksum matches.
    Good(T),
    /// No checksum: a file written before checksums existed.
    Legacy(T),
    /// Unreadable as JSON, a checksum that fails, or content of another
    /// shape: why.
    Bad(String),
}

impl<T> Checked<T> {
    /// The value, when the file is good (or legacy and `legacy_allowed`).
    pub fn usable(self, legacy_allowed: bool) -> Option<T> {
        match self {
            Checked::Good(v) => Some(v),
            Checked::Legacy(v) if legacy_allowed => Some(v),
            _ => None,
        }
    }

    /// Why the file cannot be used (`legacy_allowed` as for [`Self::usable`]).
    pub fn fault(&self, legacy_allowed: bool) -> Option<String> {
        match self {
            Checked::Good(_) => None,
            Checked::Legacy(_) if legacy_allowed => None,
            Checked::Legacy(_) => Some("has no checksum (the archive's files all have one)".into()),
            Checked::Missing => Some("is missing".into()),
            Checked::Bad(why) => Some(why.clone()),
        }
    }
}

/// The CRC-32C of a JSON object's content.
fn content_crc(object: &serde_json::Value) -> u32 {
    crc32c::crc32c(&serde_json::to_vec(object).expect("a JSON value serializes"))
}

/// The bytes of `value`'s file: its JSON object with its checksum.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    let mut object = serde_json::to_value(value).expect("serializable");
    let crc = content_crc(&object);
    object
        .as_object_mut()
        .expect("metadata values are JSON objects")
        .insert(CHECKSUM_KEY.into(), crc.into());
    serde_json::to_vec_pretty(&object).expect("serializable")
}

/// What `bytes` (a metadata file) hold.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Checked<T> {
    let mut object: serde_json::Value = match serde_json::from_slice(bytes) {
        Ok(v) => v,
        Err(e) => return Checked::Bad(format!("is not JSON ({e})")),
    };
    let Some(fields) = object.as_object_mut() else {
        return Checked::Bad("is not a JSON object".into());
    };
    let recorded = fields.remove(CHECKSUM_KEY);
    let legacy = match recorded {
        None => true,
        Some(recorded) => {
            let crc = content_crc(&object);
            if recorded.as_u64() != Some(crc as u64) {
                return Checked::Bad(format!(
                    "fails its checksum (recorded {recorded}, content {crc})"
                ));
            }
            false
        }
    };
    match serde_json::from_value(object) {
        Ok(v) if legacy => Checked::Legacy(v),
        Ok(v) => Checked::Good(v),
        Err(e) => Checked::Bad(format!("has a checksum but not the expected fields ({e})")),
    }
}

/// Reads the metadata file at `path` (an I/O error other than a missing
/// file is an error).
pub fn read<T: DeserializeOwned>(disk: &Disk, path: &Path) -> Result<Checked<T>> {
    Ok(match disk.read_all(path)? {
        None => Checked::Missing,
        Some(bytes) => decode(&bytes),
    })
}

/// Writes `value` to `path` durably, with its checksum.
pub fn write<T: Serialize>(disk: &Disk, path: &Path, value: &T) -> Result<()> {
    disk.write_durable(path, &encode(value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    struct Record {
        generation: u64,
        offset: u64,
        name: String,
    }

    fn record() -> Record {
        Record {
            generation: 7,
            offset: 4096,
            name: "img".into(),
        }
    }

    #[test]
    fn a_file_reads_back_good_and_any_changed_value_fails_its_checksum() {
        let bytes = encode(&record());
        assert!(matches!(decode::<Record>(&bytes), Checked::Good(r) if r == record()));
        let text = String::from_utf8(bytes).unwrap();
        let altered = text.replace("4096", "1");
        assert!(matches!(
            decode::<Record>(altered.as_bytes()),
            Checked::Bad(_)
        ));
        // Layout is not content: the same object compacted is still good.
        let compact: serde_json::Value = serde_json::from_str(&text).unwrap();
        let compact = serde_json::to_vec(&compact).unwrap();
        assert!(matches!(decode::<Record>(&compact), Checked::Good(_)));
    }

    #[test]
    fn a_file_without_a_checksum_is_legacy_and_used_only_when_allowed() {
        let bytes = serde_json::to_vec_pretty(&record()).unwrap();
        let checked = decode::<Record>(&bytes);
        assert!(matches!(checked, Checked::Legacy(_)));
        assert!(checked.fault(false).is_some());
        assert_eq!(checked.usable(true), Some(record()));
        assert!(matches!(decode::<Record>(b"{\"x\":"), Checked::Bad(_)));
        assert!(matches!(decode::<Record>(b"[1]"), Checked::Bad(_)));
    }
}
