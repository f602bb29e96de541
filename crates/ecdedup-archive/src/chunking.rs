//! Cutting a container's bytes into the chunks that are fingerprinted:
//! fixed blocks (the paper's), or variable chunks found by content
//! (FastCDC, the `fastcdc` crate's 2020 algorithm), which the paper names
//! as its future work.
//!
//! Content-defined chunks are laid end to end over the container's data
//! bytes and never move: blocks stay the unit of sub-files and stripes, a
//! block is unique when any byte of it belongs to a unique chunk, and only
//! the virtual stripes holding a unique block are encoded (docs/archive.md
//! weighs this design).
//!
//! Invariant: the chunks of `cut` tile `0..data.len()` in order, each at
//! most `max_bytes` long, every one but the last at least `min_bytes`.

use ecdedup_core::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::ops::Range;

use fastcdc::v2020 as cdc;

/// Bounds FastCDC takes, from the crate.
pub const CDC_MIN_BYTES: (u32, u32) = (cdc::MINIMUM_MIN as u32, cdc::MINIMUM_MAX as u32);
pub const CDC_AVG_BYTES: (u32, u32) = (cdc::AVERAGE_MIN as u32, cdc::AVERAGE_MAX as u32);
pub const CDC_MAX_BYTES: (u32, u32) = (cdc::MAXIMUM_MIN as u32, cdc::MAXIMUM_MAX as u32);

/// The chunking an archive is created with (`archive.json`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Chunking {
    /// Fixed blocks of the archive's block size.
    #[default]
    Fixed,
    /// FastCDC with these minimum, average (normalization level 1) and
    /// maximum chunk sizes.
    Fastcdc {
        min_bytes: u32,
        avg_bytes: u32,
        max_bytes: u32,
    },
}

impl Chunking {
    /// FastCDC with the sizes its authors suggest around an average:
    /// a quarter of it at least, eight times it at most.
    pub fn fastcdc(avg_bytes: u32) -> Chunking {
        Chunking::Fastcdc {
            min_bytes: avg_bytes / 4,
            avg_bytes,
            max_bytes: avg_bytes.saturating_mul(8),
        }
    }

    pub fn validate(&self) -> Result<()> {
        let Chunking::Fastcdc {
            min_bytes,
            avg_bytes,
            max_bytes,
        } = *self
        else {
            return Ok(());
        };
        for (what, v, (lo, hi)) in [
            ("minimum", min_bytes, CDC_MIN_BYTES),
            ("average", avg_bytes, CDC_AVG_BYTES),
            ("maximum", max_bytes, CDC_MAX_BYTES),
        ] {
            if v < lo || v > hi || v % 2 != 0 {
                return Err(Error::Config(format!(
                    "FastCDC {what} chunk size {v} must be even and within {lo}..={hi} bytes"
                )));
            }
        }
        if !(min_bytes <= avg_bytes && avg_bytes <= max_bytes) {
            return Err(Error::Config(format!(
                "FastCDC chunk sizes must be min <= avg <= max, got {min_bytes}, {avg_bytes}, {max_bytes}"
            )));
        }
        Ok(())
    }
}

/// The content-defined chunks of `data` (`chunking` is FastCDC and valid).
pub fn cut(chunking: &Chunking, data: &[u8]) -> Vec<Range<usize>> {
    let Chunking::Fastcdc {
        min_bytes,
        avg_bytes,
        max_bytes,
    } = *chunking
    else {
        unreachable!("cut is for content-defined chunking");
    };
    let chunks: Vec<Range<usize>> = cdc::FastCDC::new(
        data,
        min_bytes as usize,
        avg_bytes as usize,
        max_bytes as usize,
    )
    .map(|c| c.offset..c.offset + c.length)
    .collect();
    debug_assert_eq!(chunks.last().map_or(0, |c| c.end), data.len());
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn chunks_tile_the_data_and_realign_after_an_insertion() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let mut data = vec![0u8; 256 << 10];
        rng.fill(&mut data[..]);
        let chunking = Chunking::fastcdc(8 << 10);
        chunking.validate().unwrap();
        let before = cut(&chunking, &data);
        let mut at = 0;
        for c in &before {
            assert_eq!(c.start, at);
            assert!(c.len() <= 64 << 10);
            at = c.end;
        }
        assert_eq!(at, data.len());
        // 100 bytes inserted near the front: most chunks come back.
        let mut shifted = data[..1000].to_vec();
        shifted.extend_from_slice(&[7u8; 100]);
        shifted.extend_from_slice(&data[1000..]);
        let after: std::collections::HashSet<&[u8]> = cut(&chunking, &shifted)
            .into_iter()
            .map(|c| &shifted[c])
            .collect();
        let kept = before
            .iter()
            .filter(|c| after.contains(&data[(*c).clone()]))
            .count();
        assert!(kept + 3 >= before.len(), "{kept} of {}", before.len());
    }

    #[test]
    fn sizes_fastcdc_refuses_are_config_errors() {
        for bad in [
            Chunking::Fastcdc {
                min_bytes: 10,
                avg_bytes: 8192,
                max_bytes: 65536,
            },
            Chunking::Fastcdc {
                min_bytes: 4096,
                avg_bytes: 2048,
                max_bytes: 65536,
            },
            Chunking::Fastcdc {
                min_bytes: 2048,
                avg_bytes: 8191,
                max_bytes: 65536,
            },
            Chunking::Fastcdc {
                min_bytes: 2048,
                avg_bytes: 8192,
                max_bytes: u32::MAX,
            },
        ] {
            assert!(matches!(bad.validate(), Err(Error::Config(_))), "{bad:?}");
        }
    }
}
