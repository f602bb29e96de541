//! Geometry: where every byte of the volume lives.
//!
//! A stripe has w = k + m units; stripe s occupies the w consecutive places
//! s*w .. s*w+w-1 of a sequence that fills the N devices row by row (place p
//! is device p mod N, row p / N), so the units of a stripe always sit on
//! distinct devices, also when N > w. Roles rotate with the stripe number:
//! the unit at place j of stripe s has role (j - s) mod w, roles 0..k being
//! data and k..w parity, so parity moves across devices stripe by stripe
//! (with m = 2 and N = k + 2 this is RAID-6 with rotated P and Q).
//!
//! Per device: two superblock slots, the checksum area (4 bytes per block of
//! the data area), the metadata area (format 2: the device's own journal,
//! dedup maps and copies of the array-wide logs; see
//! `crate::media::area`), then the data area, aligned to 1 MiB.

use crate::error::{Error, Result};

pub const SUPERBLOCK_BYTES: u64 = 4096;
pub const SUPERBLOCK_SLOTS: u64 = 2;
pub const CHECKSUM_OFFSET: u64 = SUPERBLOCK_BYTES * SUPERBLOCK_SLOTS;
pub const DATA_ALIGN_BYTES: u64 = 1 << 20;
pub const BLOCK_BYTES_DEFAULT: u32 = 4096;
pub const STRIPE_UNIT_BYTES_MIN: u32 = 4 << 10;
pub const STRIPE_UNIT_BYTES_MAX: u32 = 4 << 20;
/// The superblock holds one state entry per device.
pub const DEVICES_MAX: u32 = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub devices: u32,
    pub k: u32,
    pub m: u32,
    pub stripe_unit_bytes: u32,
    pub block_bytes: u32,
    pub stripes: u64,
    /// Bytes of each device's metadata area; 0: the metadata lives in the
    /// array folder (format 1).
    pub meta_area_bytes: u64,
}

/// Largest metadata area per device.
pub const META_AREA_BYTES_MAX: u64 = 1 << 40;

/// A unit's physical place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    pub device: usize,
    pub row: u64,
}

impl Geometry {
    /// Builds and checks a geometry for a volume of at least `volume_bytes`.
    pub fn new(
        devices: u32,
        k: u32,
        m: u32,
        stripe_unit_bytes: u32,
        volume_bytes: u64,
    ) -> Result<Geometry> {
        let g = Geometry {
            devices,
            k,
            m,
            stripe_unit_bytes,
            block_bytes: BLOCK_BYTES_DEFAULT,
            stripes: 0,
            meta_area_bytes: 0,
        };
        let stripe_data = g.stripe_data_bytes();
        if stripe_data == 0 {
            return Err(Error::Config("k must be at least 1".into()));
        }
        let stripes = volume_bytes.div_ceil(stripe_data);
        let g = Geometry { stripes, ..g };
        g.validate()?;
        Ok(g)
    }

    /// Checks every rule; used for new geometries and ones read from disk.
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(Error::Config(msg));
        if self.k < 1 {
            return bad("k must be at least 1".into());
        }
        if self.m < 1 {
            return bad("m must be at least 1 (m = 0 has no redundancy)".into());
        }
        // In u64: k and m may come from disk, and their u32 sum can wrap.
        let width = self.k as u64 + self.m as u64;
        if width > 255 {
            return bad(format!("k + m = {width} exceeds 255, the GF(2^8) limit"));
        }
        if (self.devices as u64) < width {
            return bad(format!(
                "RS({},{}) needs at least {width} devices, {} given",
                self.k, self.m, self.devices
            ));
        }
        if self.devices > DEVICES_MAX {
            return bad(format!(
                "at most {DEVICES_MAX} devices per array, {} given",
                self.devices
            ));
        }
        let su = self.stripe_unit_bytes;
        if !(STRIPE_UNIT_BYTES_MIN..=STRIPE_UNIT_BYTES_MAX).contains(&su) || !su.is_power_of_two() {
            return bad(format!(
                "stripe unit {su} bytes must be a power of two from 4 KiB to 4 MiB"
            ));
        }
        if self.block_bytes != BLOCK_BYTES_DEFAULT {
            return bad(format!(
                "block size {} is not supported (4096 only)",
                self.block_bytes
            ));
        }
        if self.stripes == 0 {
            return bad("volume size must be greater than zero".into());
        }
        let area = self.meta_area_bytes;
        if area != 0
            && (!area.is_multiple_of(DATA_ALIGN_BYTES)
                || !(crate::media::area::AREA_BYTES_MIN..=META_AREA_BYTES_MAX).contains(&area))
        {
            return bad(format!(
                "metadata area of {area} bytes: a multiple of 1 MiB from 1 MiB to 1 TiB"
            ));
        }
        // Stripes first: the volume's size is only computed once it fits.
        let volume_bytes = self.stripes.checked_mul(self.stripe_data_bytes());
        if self.stripes > (1u64 << 40) || volume_bytes.and_then(|v| v.checked_mul(2)).is_none() {
            return bad(format!(
                "volume is too large: {} stripes of {} data bytes, where an array holds at \
                 most 2^40 stripes and under 2^63 bytes",
                self.stripes,
                self.stripe_data_bytes()
            ));
        }
        Ok(())
    }

    pub fn width(&self) -> usize {
        (self.k + self.m) as usize
    }
    pub fn k(&self) -> usize {
        self.k as usize
    }
    pub fn m(&self) -> usize {
        self.m as usize
    }
    pub fn unit_bytes(&self) -> u64 {
        self.stripe_unit_bytes as u64
    }
    pub fn block(&self) -> u64 {
        self.block_bytes as u64
    }
    pub fn blocks_per_unit(&self) -> u64 {
        self.unit_bytes() / self.block()
    }
    pub fn stripe_data_bytes(&self) -> u64 {
        self.k as u64 * self.stripe_unit_bytes as u64
    }
    pub fn volume_bytes(&self) -> u64 {
        self.stripes * self.stripe_data_bytes()
    }
    /// Unit rows each device holds.
    pub fn rows_per_device(&self) -> u64 {
        (self.stripes * self.width() as u64).div_ceil(self.devices as u64)
    }
    pub fn blocks_per_device(&self) -> u64 {
        self.rows_per_device() * self.blocks_per_unit()
    }
    pub fn checksum_area_bytes(&self) -> u64 {
        (self.blocks_per_device() * 4).div_ceil(4096) * 4096
    }
    /// Where the metadata area starts (1 MiB aligned, after the checksums).
    pub fn meta_area_offset(&self) -> u64 {
        (CHECKSUM_OFFSET + self.checksum_area_bytes()).div_ceil(DATA_ALIGN_BYTES) * DATA_ALIGN_BYTES
    }
    pub fn data_offset(&self) -> u64 {
        self.meta_area_offset() + self.meta_area_bytes
    }
    /// The same geometry with a metadata area of `bytes` on each device
    /// (rounded up to 1 MiB).
    pub fn with_meta_area(self, bytes: u64) -> Result<Geometry> {
        let g = Geometry {
            meta_area_bytes: bytes.div_ceil(DATA_ALIGN_BYTES) * DATA_ALIGN_BYTES,
            ..self
        };
        g.validate()?;
        Ok(g)
    }
    /// The smallest device that holds this geometry.
    pub fn device_bytes_min(&self) -> u64 {
        self.data_offset() + self.rows_per_device() * self.unit_bytes()
    }

    /// Place of the unit with `role` (0..k data, k..w parity) of `stripe`.
    pub fn place(&self, stripe: u64, role: usize) -> Place {
        debug_assert!(stripe < self.stripes && role < self.width());
        let w = self.width() as u64;
        let slot = (role as u64 + stripe) % w;
        let p = stripe * w + slot;
        Place {
            device: (p % self.devices as u64) as usize,
            row: p / self.devices as u64,
        }
    }

    /// Role of `device` in `stripe`, if the stripe has a unit there.
    pub fn role_on(&self, stripe: u64, device: usize) -> Option<usize> {
        (0..self.width()).find(|&r| self.place(stripe, r).device == device)
    }

    /// Byte offset on the device of `block` (0..blocks_per_unit) of a unit at `row`.
    pub fn device_offset(&self, row: u64, block_in_unit: u64) -> u64 {
        self.data_offset() + row * self.unit_bytes() + block_in_unit * self.block()
    }

    /// Index into the device's checksum table.
    pub fn checksum_index(&self, row: u64, block_in_unit: u64) -> u64 {
        row * self.blocks_per_unit() + block_in_unit
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;

    #[test]
    fn raid6_parity_rotates_across_devices() {
        let g = Geometry::new(6, 4, 2, 32 << 10, 6 * 4 * (32 << 10)).unwrap();
        let parity_devices: HashSet<usize> = (0..g.stripes)
            .flat_map(|s| [g.place(s, 4).device, g.place(s, 5).device])
            .collect();
        assert_eq!(parity_devices.len(), 6);
    }

    #[test]
    fn bad_geometries_are_refused_with_reasons() {
        assert!(Geometry::new(5, 4, 2, 32 << 10, 1 << 30)
            .unwrap_err()
            .to_string()
            .contains("at least 6 devices"));
        assert!(Geometry::new(6, 4, 2, 3000, 1 << 30).is_err());
        assert!(Geometry::new(6, 4, 2, 8 << 20, 1 << 30).is_err());
        assert!(Geometry::new(6, 4, 0, 32 << 10, 1 << 30).is_err());
        assert!(Geometry::new(6, 4, 2, 32 << 10, 0).is_err());
    }

    proptest! {
        #[test]
        fn every_place_is_used_once_and_stripes_span_distinct_devices(
            k in 1u32..8, m in 1u32..4, extra in 0u32..3, stripes in 1u64..40
        ) {
            let n = k + m + extra;
            let g = Geometry::new(n, k, m, 4096, stripes * k as u64 * 4096).unwrap();
            let mut seen = HashSet::new();
            for s in 0..g.stripes {
                let devs: HashSet<usize> = (0..g.width()).map(|r| g.place(s, r).device).collect();
                prop_assert_eq!(devs.len(), g.width());
                for r in 0..g.width() {
                    let p = g.place(s, r);
                    prop_assert!(p.row < g.rows_per_device());
                    prop_assert!(seen.insert((p.device, p.row)));
                    prop_assert_eq!(g.role_on(s, p.device), Some(r));
                }
            }
        }
    }
}
