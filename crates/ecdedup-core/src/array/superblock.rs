//! The superblock: who a device is and what the array looked like at a
//! generation. Each device has two 4 KiB slots; generation g goes to slot
//! g mod 2, so a torn write leaves the previous generation intact in the
//! other slot. Reading takes the valid slot with the highest generation.
//! Layout (little endian) is drawn in docs/format.md.

use super::layout::{Geometry, DEVICES_MAX, SUPERBLOCK_BYTES};
use crate::error::{Error, Result};

pub const MAGIC: [u8; 8] = *b"ECDDSB01";
/// Format 1: metadata in the array folder; format 2: a metadata area on
/// each device (its size at byte 104). A superblock is written in the
/// format its geometry needs, so arrays of format 1 stay format 1.
pub const FORMAT_VERSION: u32 = 2;
const HEADER_BYTES: usize = 128;
const STATE_ENTRY_BYTES: usize = 16;
/// The member table: the device UUID of each position's occupant, after
/// the state table of the most devices an array may have.
const MEMBERS_AT: usize = HEADER_BYTES + DEVICES_MAX as usize * STATE_ENTRY_BYTES;
const MEMBER_ENTRY_BYTES: usize = 16;
const CHECKSUM_AT: usize = SUPERBLOCK_BYTES as usize - 4;
const _: () = assert!(MEMBERS_AT + DEVICES_MAX as usize * MEMBER_ENTRY_BYTES <= CHECKSUM_AT);

/// The state of one device position, as the array sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum MemberState {
    Active,
    Failed,
    /// Stripes below `cursor` hold rebuilt content.
    Rebuilding {
        cursor: u64,
    },
}

impl MemberState {
    fn encode(self) -> (u8, u64) {
        match self {
            MemberState::Active => (0, 0),
            MemberState::Failed => (1, 0),
            MemberState::Rebuilding { cursor } => (2, cursor),
        }
    }
    fn decode(tag: u8, cursor: u64) -> Option<MemberState> {
        match tag {
            0 => Some(MemberState::Active),
            1 => Some(MemberState::Failed),
            2 => Some(MemberState::Rebuilding { cursor }),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub array_uuid: [u8; 16],
    pub device_uuid: [u8; 16],
    pub generation: u64,
    pub position: u32,
    pub geometry: Geometry,
    pub volume_bytes: u64,
    /// 0: never shut down uncleanly since the last flush of everything.
    pub states: Vec<MemberState>,
    /// The device UUID of the member in each position as of this
    /// generation (a replacement gets a new one); all zero where not
    /// recorded (superblocks written before 2026-11-26). Tells the member
    /// a position still has from an earlier occupant of it.
    pub member_uuids: Vec<[u8; 16]>,
    /// The boot id of the chunk server that held this device when the slot
    /// was written, where the writer had made every parity journal
    /// durable since its open (so every journal record past a journal's
    /// synced length was appended in that boot); 0: none (a local device,
    /// or a slot written earlier in an open, or before 2026-11-28). A
    /// server with that boot id now never restarted since: what it
    /// acknowledged is in its files (`Array::trust_fold_marks_of_servers_that_never_restarted`).
    pub boot_stamp: u64,
}

impl Superblock {
    pub fn encode(&self) -> Vec<u8> {
        let g = &self.geometry;
        assert_eq!(self.states.len(), g.devices as usize);
        assert_eq!(self.member_uuids.len(), g.devices as usize);
        let mut b = vec![0u8; SUPERBLOCK_BYTES as usize];
        b[0..8].copy_from_slice(&MAGIC);
        let version: u32 = if g.meta_area_bytes == 0 { 1 } else { 2 };
        b[8..12].copy_from_slice(&version.to_le_bytes());
        b[12..16].copy_from_slice(&(HEADER_BYTES as u32).to_le_bytes());
        b[16..32].copy_from_slice(&self.array_uuid);
        b[32..48].copy_from_slice(&self.device_uuid);
        b[48..56].copy_from_slice(&self.generation.to_le_bytes());
        b[56..60].copy_from_slice(&self.position.to_le_bytes());
        b[60..64].copy_from_slice(&g.devices.to_le_bytes());
        b[64..68].copy_from_slice(&g.k.to_le_bytes());
        b[68..72].copy_from_slice(&g.m.to_le_bytes());
        b[72..76].copy_from_slice(&g.stripe_unit_bytes.to_le_bytes());
        b[76..80].copy_from_slice(&g.block_bytes.to_le_bytes());
        b[80..88].copy_from_slice(&g.stripes.to_le_bytes());
        b[88..96].copy_from_slice(&self.volume_bytes.to_le_bytes());
        b[96..104].copy_from_slice(&g.data_offset().to_le_bytes());
        b[104..112].copy_from_slice(&g.meta_area_bytes.to_le_bytes());
        b[112..120].copy_from_slice(&self.boot_stamp.to_le_bytes());
        for (i, s) in self.states.iter().enumerate() {
            let (tag, cursor) = s.encode();
            let at = HEADER_BYTES + i * STATE_ENTRY_BYTES;
            b[at] = tag;
            b[at + 8..at + 16].copy_from_slice(&cursor.to_le_bytes());
        }
        for (i, uuid) in self.member_uuids.iter().enumerate() {
            let at = MEMBERS_AT + i * MEMBER_ENTRY_BYTES;
            b[at..at + MEMBER_ENTRY_BYTES].copy_from_slice(uuid);
        }
        let crc = crc32c::crc32c(&b[..CHECKSUM_AT]);
        b[CHECKSUM_AT..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes one slot; every field is checked, so a corrupt slot never
    /// yields a superblock.
    pub fn decode(b: &[u8]) -> Result<Superblock> {
        let corrupt = |why: &str| Err(Error::Corrupt(format!("superblock: {why}")));
        if b.len() != SUPERBLOCK_BYTES as usize {
            return corrupt("wrong size");
        }
        if b[0..8] != MAGIC {
            return corrupt("no ecdedup magic (not an ecdedup device, or never initialised)");
        }
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
        let crc = u32_at(CHECKSUM_AT);
        if crc != crc32c::crc32c(&b[..CHECKSUM_AT]) {
            return corrupt("checksum mismatch");
        }
        let version = u32_at(8);
        if version == 0 || version > FORMAT_VERSION {
            return corrupt(&format!("format version {version} is not supported"));
        }
        let meta_area_bytes = u64_at(104);
        if (version == 1) != (meta_area_bytes == 0) {
            return corrupt(&format!(
                "format {version} with a metadata area of {meta_area_bytes} bytes"
            ));
        }
        let geometry = Geometry {
            devices: u32_at(60),
            k: u32_at(64),
            m: u32_at(68),
            stripe_unit_bytes: u32_at(72),
            block_bytes: u32_at(76),
            stripes: u64_at(80),
            meta_area_bytes,
        };
        geometry
            .validate()
            .map_err(|e| Error::Corrupt(format!("superblock geometry: {e}")))?;
        if u64_at(96) != geometry.data_offset() {
            return corrupt("data offset does not match geometry");
        }
        let position = u32_at(56);
        if position >= geometry.devices {
            return corrupt("position out of range");
        }
        // The volume's size bounds every request: past the last stripe it
        // would name units that do not exist.
        let volume_bytes = u64_at(88);
        let stripes_bytes = geometry.volume_bytes();
        if volume_bytes == 0
            || volume_bytes > stripes_bytes
            || volume_bytes <= stripes_bytes - geometry.stripe_data_bytes()
        {
            return corrupt(&format!(
                "volume of {volume_bytes} bytes does not fit its {} stripes",
                geometry.stripes
            ));
        }
        let mut states = Vec::with_capacity(geometry.devices as usize);
        for i in 0..geometry.devices as usize {
            let at = HEADER_BYTES + i * STATE_ENTRY_BYTES;
            match MemberState::decode(b[at], u64_at(at + 8)) {
                Some(s) => states.push(s),
                None => return corrupt("unknown device state"),
            }
        }
        let member_uuids = (0..geometry.devices as usize)
            .map(|i| {
                let at = MEMBERS_AT + i * MEMBER_ENTRY_BYTES;
                b[at..at + MEMBER_ENTRY_BYTES].try_into().unwrap()
            })
            .collect();
        Ok(Superblock {
            array_uuid: b[16..32].try_into().unwrap(),
            device_uuid: b[32..48].try_into().unwrap(),
            generation: u64_at(48),
            position,
            geometry,
            volume_bytes,
            states,
            member_uuids,
            boot_stamp: u64_at(112),
        })
    }

    /// The device UUID this superblock records for position `i`'s member;
    /// None where it records none.
    pub fn member_uuid(&self, i: usize) -> Option<[u8; 16]> {
        self.member_uuids.get(i).copied().filter(|u| *u != [0; 16])
    }

    pub fn slot_offset(generation: u64) -> u64 {
        (generation % 2) * SUPERBLOCK_BYTES
    }

    /// Picks the newest valid slot; the error names why both failed.
    pub fn newest(slot_a: &[u8], slot_b: &[u8]) -> Result<Superblock> {
        match (Superblock::decode(slot_a), Superblock::decode(slot_b)) {
            (Ok(a), Ok(b)) => Ok(if b.generation > a.generation { b } else { a }),
            (Ok(a), Err(_)) => Ok(a),
            (Err(_), Ok(b)) => Ok(b),
            (Err(e), Err(_)) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Superblock {
        let geometry = Geometry::new(6, 4, 2, 32 << 10, 1 << 30).unwrap();
        Superblock {
            array_uuid: [7; 16],
            device_uuid: [9; 16],
            generation: 5,
            position: 3,
            geometry,
            volume_bytes: 1 << 30,
            states: vec![
                MemberState::Active,
                MemberState::Failed,
                MemberState::Rebuilding { cursor: 42 },
                MemberState::Active,
                MemberState::Active,
                MemberState::Active,
            ],
            member_uuids: (1..=6).map(|i| [i; 16]).collect(),
            boot_stamp: 0x0123_4567_89ab_cdef,
        }
    }

    /// Decodes `b` after `patch` changed it, its checksum resealed (a
    /// slot whose fields lie but whose checksum holds).
    fn decode_patched(mut b: Vec<u8>, patch: impl FnOnce(&mut [u8])) -> Result<Superblock> {
        patch(&mut b);
        let crc = crc32c::crc32c(&b[..CHECKSUM_AT]);
        b[CHECKSUM_AT..].copy_from_slice(&crc.to_le_bytes());
        Superblock::decode(&b)
    }

    #[test]
    fn superblock_round_trips() {
        let s = sample();
        assert_eq!(Superblock::decode(&s.encode()).unwrap(), s);
    }

    #[test]
    fn any_flipped_byte_is_detected() {
        let bytes = sample().encode();
        for at in (0..bytes.len()).step_by(7) {
            let mut b = bytes.clone();
            b[at] ^= 0x40;
            assert!(
                Superblock::decode(&b).is_err(),
                "flip at {at} went unnoticed"
            );
        }
    }

    /// A volume size past the last stripe (with a valid checksum) would let
    /// requests name stripes that do not exist: a corrupt superblock.
    #[test]
    fn a_volume_size_that_does_not_fit_the_stripes_is_refused() {
        let s = sample();
        let fits = s.geometry.volume_bytes();
        for bad in [0, fits + 1, fits - s.geometry.stripe_data_bytes(), u64::MAX] {
            let err = decode_patched(s.encode(), |b| {
                b[88..96].copy_from_slice(&bad.to_le_bytes())
            })
            .unwrap_err()
            .to_string();
            assert!(err.contains("does not fit"), "{bad}: {err}");
        }
        let mut ok = s.clone();
        ok.volume_bytes = fits - s.geometry.stripe_data_bytes() + 1;
        assert_eq!(Superblock::decode(&ok.encode()).unwrap(), ok);
    }

    /// A stripe count whose volume overflows u64 (with a valid checksum)
    /// is a corrupt superblock, not an arithmetic overflow in the check.
    #[test]
    fn a_stripe_count_whose_volume_overflows_is_refused() {
        let err = decode_patched(sample().encode(), |b| {
            b[80..88].copy_from_slice(&(1u64 << 60).to_le_bytes())
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("too large"), "{err}");
    }

    /// Found by the fuzz target `superblock`: k and m whose u32 sum wraps
    /// (with a valid checksum) are refused, not an overflow in the check.
    #[test]
    fn k_and_m_whose_sum_wraps_are_refused() {
        let err = decode_patched(sample().encode(), |b| {
            b[64..68].copy_from_slice(&u32::MAX.to_le_bytes());
            b[68..72].copy_from_slice(&2u32.to_le_bytes());
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("exceeds 255"), "{err}");
    }

    /// A slot written before the member table existed holds zeros there:
    /// it decodes with no member recorded, not as a corrupt slot.
    #[test]
    fn a_slot_without_a_member_table_records_no_member() {
        let s = sample();
        let old = decode_patched(s.encode(), |b| b[MEMBERS_AT..CHECKSUM_AT].fill(0)).unwrap();
        assert_eq!(old.member_uuid(3), None);
        assert_eq!(s.member_uuid(3), Some([4; 16]));
        let unrecorded = Superblock {
            member_uuids: vec![[0; 16]; 6],
            ..s
        };
        assert_eq!(old, unrecorded);
    }

    #[test]
    fn newest_valid_slot_wins_and_a_torn_slot_falls_back() {
        let a = sample();
        let mut b = sample();
        b.generation = 6;
        assert_eq!(
            Superblock::newest(&a.encode(), &b.encode())
                .unwrap()
                .generation,
            6
        );
        let mut torn = b.encode();
        torn[100] ^= 1;
        assert_eq!(
            Superblock::newest(&a.encode(), &torn).unwrap().generation,
            5
        );
        assert!(Superblock::newest(&[0; 4096], &[0; 4096]).is_err());
    }
}
