//! Sealing a batch of containers: dedup before encoding, pseudo-shuffling,
//! sub-file exchange, encoding of the virtual stripes that hold a unique
//! block, and the durable write of sub-files, parity and map.
//!
//! A container's data (object bytes, zero-padded to a whole number of
//! stripes of k blocks) is cut into k contiguous sub-files of n blocks each;
//! block (j, l) is column l of sub-file j, at byte (j n + l) x block of the
//! container. Order of durability: data sub-files and parity files (each
//! written to a temporary name, synced, renamed), then the map (the commit:
//! the batch is visible from then on), then the staging files go.

use super::exchange::{self, SubFileCount};
use super::map::{BatchMap, BlockAddress, BlockEntry, ContainerMap, GroupMap, SubFileMap};
use super::shuffle::pseudo_shuffle;
use super::{disk, map_name, parity_name, sub_file_name, ArchiveStore, MAPS_DIR, STAGING_DIR};
use crate::error::{Error, Result};
use crate::fingerprint::FingerprintBackend;
use std::time::Instant;

fn elapsed_ns(since: Instant) -> u64 {
    since.elapsed().as_nanos().min(u64::MAX as u128) as u64
}

/// One container's bytes while it is sealed.
struct Staged {
    id: u32,
    data_bytes: u64,
    blocks_per_sub_file: usize,
    bytes: Vec<u8>,
}

impl Staged {
    fn block(&self, sub_file: usize, column: usize, block_bytes: usize) -> &[u8] {
        let at = (sub_file * self.blocks_per_sub_file + column) * block_bytes;
        &self.bytes[at..at + block_bytes]
    }
}

impl ArchiveStore {
    /// Seals containers `ids` (staging files, in order) as one batch.
    pub(super) fn seal_batch(&mut self, ids: &[u32]) -> Result<()> {
        let k = self.config.k;
        let m = self.config.m;
        let block = self.config.block_bytes as usize;
        let device_count = self.config.devices.len();
        if let Some(&d) = self.missing_devices.first() {
            return Err(Error::Unavailable(format!(
                "archive device {d} is missing: `archive scrub --repair` restores it before sealing"
            )));
        }
        let mut staged = Vec::new();
        for &id in ids {
            let path = self.staging_path(id);
            let mut bytes = disk::read_all(&path)?.ok_or_else(|| {
                Error::Corrupt(format!("staging file {} is missing", path.display()))
            })?;
            let data_bytes = bytes.len() as u64;
            let n = bytes.len().div_ceil(k * block).max(1);
            bytes.resize(n * k * block, 0);
            staged.push(Staged {
                id,
                data_bytes,
                blocks_per_sub_file: n,
                bytes,
            });
        }

        // Dedup before encoding: fingerprints, cache lookups, sources.
        let preprocess_start = Instant::now();
        let mut containers = Vec::new();
        let mut fingerprints = Vec::new();
        for (ci, c) in staged.iter().enumerate() {
            self.report_progress("seal: dedup", ci as u64, staged.len() as u64);
            self.timings.container_bytes += c.bytes.len() as u64;
            let chunks: Vec<&[u8]> = c.bytes.chunks(block).collect();
            let fingerprint_start = Instant::now();
            self.backend
                .fingerprint_batch(self.config.fingerprint, &chunks, &mut fingerprints)
                .map_err(|e| Error::Other(format!("fingerprint container {}: {e}", c.id)))?;
            self.timings.fingerprint_ns += elapsed_ns(fingerprint_start);
            let n = c.blocks_per_sub_file;
            let mut sub_files = Vec::new();
            for j in 0..k {
                let mut blocks = Vec::with_capacity(n);
                let mut unique = Vec::with_capacity(n);
                for l in 0..n {
                    let bytes = chunks[j * n + l];
                    let fp = fingerprints[j * n + l];
                    let mut source = self.cache.get(&fp).filter(|a| {
                        self.container_batch.contains_key(&a.container)
                            || staged[..=ci].iter().any(|s| s.id == a.container)
                    });
                    if let Some(a) = source {
                        if self.config.verify && !self.same_bytes(a, bytes, &staged[..=ci])? {
                            source = None;
                        }
                    }
                    if source.is_none() {
                        self.cache.insert(
                            fp,
                            BlockAddress {
                                container: c.id,
                                sub_file: j as u8,
                                column: l as u32,
                            },
                        );
                    }
                    unique.push(source.is_none());
                    blocks.push(BlockEntry {
                        position: 0,
                        crc: crc32c::crc32c(bytes),
                        source,
                    });
                }
                // Procedure 1.
                let (positions, _) = pseudo_shuffle(&unique);
                let mut column_at = vec![0u32; n];
                for (l, (entry, &p)) in blocks.iter_mut().zip(&positions).enumerate() {
                    entry.position = p;
                    column_at[p as usize] = l as u32;
                }
                sub_files.push(SubFileMap {
                    device: 0,
                    group: 0,
                    member: 0,
                    blocks,
                    column_at,
                });
            }
            containers.push(ContainerMap {
                id: c.id,
                data_bytes: c.data_bytes,
                blocks_per_sub_file: n as u32,
                sub_files,
            });
        }

        // Procedure 2, then placement: group g's members and parity on
        // k + m distinct devices, rotated by the group's id.
        let counts: Vec<SubFileCount> = containers
            .iter()
            .enumerate()
            .flat_map(|(ci, c)| {
                c.sub_files
                    .iter()
                    .enumerate()
                    .map(move |(j, s)| SubFileCount {
                        container_index: ci,
                        sub_file: j as u8,
                        unique: s.unique_blocks(),
                    })
            })
            .collect();
        let batch = ids[0];
        let mut map = BatchMap {
            k: k as u8,
            m: m as u8,
            block_bytes: block as u32,
            batch,
            containers,
            groups: Vec::new(),
        };
        let groups = exchange::exchange(&counts, k);
        self.timings.preprocess_ns += elapsed_ns(preprocess_start);
        let encode_start = Instant::now();
        let group_count = groups.len() as u64;
        let zero = vec![0u8; block];
        let mut parity_files = Vec::new();
        for (g, members) in groups.into_iter().enumerate() {
            self.report_progress("seal: encode", g as u64, group_count);
            let group_id = map.group_id(g) as usize;
            let encoded = members.iter().map(|s| s.unique).max().unwrap_or(0);
            for (i, s) in members.iter().enumerate() {
                let sub = &mut map.containers[s.container_index].sub_files[s.sub_file as usize];
                sub.device = ((group_id + i) % device_count) as u16;
                sub.group = g as u16;
                sub.member = i as u8;
            }
            let parity_devices: Vec<u16> = (0..m)
                .map(|i| ((group_id + k + i) % device_count) as u16)
                .collect();
            let mut parity = vec![vec![0u8; encoded as usize * block]; m];
            let mut parity_crcs = vec![0u32; m * encoded as usize];
            for position in 0..encoded as usize {
                let data: Vec<&[u8]> = members
                    .iter()
                    .map(|s| {
                        let c = &staged[s.container_index];
                        if position >= c.blocks_per_sub_file {
                            return &zero[..];
                        }
                        let sub = &map.containers[s.container_index].sub_files[s.sub_file as usize];
                        c.block(s.sub_file as usize, sub.column_at[position] as usize, block)
                    })
                    .collect();
                let mut out: Vec<&mut [u8]> = parity
                    .iter_mut()
                    .map(|p| &mut p[position * block..(position + 1) * block])
                    .collect();
                self.codec.encode(&data, &mut out);
                for (i, p) in out.iter().enumerate() {
                    parity_crcs[i * encoded as usize + position] = crc32c::crc32c(p);
                }
            }
            for (i, bytes) in parity.into_iter().enumerate() {
                let path = self
                    .device_dir(parity_devices[i] as usize)
                    .join(parity_name(group_id as u32, i));
                parity_files.push((path, bytes));
            }
            map.groups.push(GroupMap {
                members: members
                    .iter()
                    .map(|s| (staged[s.container_index].id, s.sub_file))
                    .collect(),
                encoded,
                parity_devices,
                parity_crcs,
            });
        }

        self.timings.encode_ns += elapsed_ns(encode_start);

        // Durable: sub-files, parity, then the map (the commit).
        let write_start = Instant::now();
        let files = (staged.len() * k + parity_files.len()) as u64;
        let mut written = 0u64;
        for (c, cm) in staged.iter().zip(&map.containers) {
            let sub_file_bytes = c.blocks_per_sub_file * block;
            for (j, sub) in cm.sub_files.iter().enumerate() {
                self.report_progress("seal: write", written, files);
                written += 1;
                let path = self
                    .device_dir(sub.device as usize)
                    .join(sub_file_name(c.id, j as u8));
                disk::write_durable(
                    &path,
                    &c.bytes[j * sub_file_bytes..(j + 1) * sub_file_bytes],
                )?;
            }
        }
        for (path, bytes) in &parity_files {
            self.report_progress("seal: write", written, files);
            written += 1;
            disk::write_durable(path, bytes)?;
        }
        let encoded = map.encode();
        debug_assert!(BatchMap::decode(&encoded, "new").is_ok_and(|d| d == map));
        disk::write_durable(&self.dir.join(MAPS_DIR).join(map_name(batch)), &encoded)?;
        self.timings.write_ns += elapsed_ns(write_start);
        self.report_progress("seal: write", files, files);
        for c in &map.containers {
            self.container_batch.insert(c.id, batch);
        }
        self.batches.insert(batch, map);
        for &id in ids {
            disk::remove(&self.staging_path(id))?;
        }
        disk::sync_dir(&self.dir.join(STAGING_DIR))?;
        self.save_cache()
    }

    /// Whether the block at `a` holds exactly `bytes` (the byte compare on
    /// a fingerprint hit). A source that cannot be read is not a match.
    fn same_bytes(&self, a: BlockAddress, bytes: &[u8], batch: &[Staged]) -> Result<bool> {
        let block = self.config.block_bytes as usize;
        if let Some(c) = batch.iter().find(|c| c.id == a.container) {
            return Ok(c.block(a.sub_file as usize, a.column as usize, block) == bytes);
        }
        Ok(self.read_block(a).is_ok_and(|b| b == bytes))
    }
}
