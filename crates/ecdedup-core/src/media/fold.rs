//! The parity fold: a replay's arithmetic run where the parity lives, in
//! the device's own coordinates (docs/cluster.md, "The data path").
//!
//! A [`Fold`] names parity blocks by device offset, each with the CRC32C
//! its writer expects it to hold now and a list of [`Term`]s; a term is a
//! GF(2^8) coefficient `c` and one or two device ranges `a`, `b` of the
//! same length, and means `parity[at..at+len] ^= c * (a ^ b)` (parix:
//! `a` = d(0), `b` = d(r), `c` the generator's coefficient of the parity
//! and data units, from the writer's codec; plog: `a` a logged parity
//! delta, `c` = 1, no `b`). The device knows nothing of stripes, roles or
//! the code: [`run`] is the one implementation, used by the local devices
//! (a batch's [`super::Op::Fold`] on the calling thread) and by the chunk
//! server (`proto::frame::Op::Replay`).
//!
//! Invariants:
//! - a fold is checked whole ([`Fold::check`]) before any byte is read;
//! - every read (old parity, then every term's ranges) completes before
//!   any write: an error while reading writes nothing;
//! - a row whose stored parity does not have the expected checksum (or
//!   cannot be read) is answered [`RowAnswer::Mismatch`]
//!   ([`RowAnswer::Unreadable`]) and not written, so a fold sent twice
//!   (a duplicated or late frame) changes nothing the second time;
//! - the rows answered [`RowAnswer::Folded`] are written (and synced when
//!   `fua`) before `run` returns, each with its new checksum; a write
//!   error returns the error (the device's content is then unknown, as
//!   after any failed write).
//!
//! Limits: [`FOLD_ROWS_MAX`] rows, [`FOLD_PARITY_BYTES_MAX`] bytes of
//! parity held at once, [`FOLD_TERMS_MAX`] terms; operands are read
//! [`FOLD_READ_WINDOW`] ranges at a time.

use super::{submit, Device, DeviceIo, Op, WriteHint};
use crate::counters::IoClass;
use std::io;

/// Rows (parity blocks) of one fold: a 4 MiB stripe unit of 4 KiB blocks.
pub const FOLD_ROWS_MAX: usize = 1024;
/// Bytes of parity one fold holds in RAM (rows x block bytes).
pub const FOLD_PARITY_BYTES_MAX: u64 = 4 << 20;
/// Terms of one fold, all rows together.
pub const FOLD_TERMS_MAX: usize = 16384;
/// Operand ranges read in one batch.
pub const FOLD_READ_WINDOW: usize = 256;

/// `parity[at..at + len] ^= coefficient * (a ^ b)`, `a` and `b` device
/// offsets of `len` bytes (`b` absent: `a` alone).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Term {
    pub coefficient: u8,
    /// Byte offset in the parity block.
    pub at: u32,
    pub len: u32,
    pub a: u64,
    pub b: Option<u64>,
}

/// One parity block: where it is, the checksum it must have now, and
/// what is folded into it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// Device offset of the parity block.
    pub parity: u64,
    pub expected_crc32c: u32,
    pub terms: Vec<Term>,
}

/// A fold of parity rows of one device (one parity unit of one stripe, or
/// part of one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fold {
    /// Bytes of every parity block.
    pub block_bytes: u32,
    pub rows: Vec<Row>,
}

/// What a fold did with one row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowAnswer {
    /// Folded and written; the new parity's checksum.
    Folded { crc32c: u32 },
    /// The stored parity has another checksum (`crc32c`, what it holds):
    /// nothing written.
    Mismatch { crc32c: u32 },
    /// The stored parity could not be read: nothing written.
    Unreadable,
}

impl Fold {
    /// Terms of every row.
    pub fn terms(&self) -> usize {
        self.rows.iter().map(|r| r.terms.len()).sum()
    }

    /// Checks what needs no device: counts within their bounds, every
    /// term nonzero, non-empty and inside its parity block.
    pub fn check_shape(&self) -> Result<(), String> {
        let block = self.block_bytes;
        if block == 0 {
            return Err("a fold of 0-byte parity blocks".into());
        }
        if self.rows.is_empty() || self.rows.len() > FOLD_ROWS_MAX {
            return Err(format!(
                "a fold of {} rows (1 to {FOLD_ROWS_MAX})",
                self.rows.len()
            ));
        }
        let parity_bytes = self.rows.len() as u64 * u64::from(block);
        if parity_bytes > FOLD_PARITY_BYTES_MAX {
            return Err(format!(
                "a fold of {} rows of {block} bytes: {parity_bytes} bytes of parity (at most \
                 {FOLD_PARITY_BYTES_MAX})",
                self.rows.len()
            ));
        }
        if self.terms() > FOLD_TERMS_MAX {
            return Err(format!(
                "a fold of {} terms (at most {FOLD_TERMS_MAX})",
                self.terms()
            ));
        }
        for row in &self.rows {
            for t in &row.terms {
                if t.coefficient == 0 {
                    return Err(format!(
                        "a term of coefficient 0 for the parity at {}",
                        row.parity
                    ));
                }
                if t.len == 0 || t.at.checked_add(t.len).is_none_or(|end| end > block) {
                    return Err(format!(
                        "a term of {} bytes at {} in a parity block of {block} bytes",
                        t.len, t.at
                    ));
                }
            }
        }
        Ok(())
    }

    /// [`Fold::check_shape`], and every range inside a device of
    /// `device_bytes`, no two rows on the same bytes.
    pub fn check(&self, device_bytes: u64) -> Result<(), String> {
        self.check_shape()?;
        let inside = |what: &str, offset: u64, len: u64| match offset.checked_add(len) {
            Some(end) if end <= device_bytes => Ok(()),
            _ => Err(format!(
                "{what} [{offset}, +{len}) is past the end of the device ({device_bytes} bytes)"
            )),
        };
        let block = u64::from(self.block_bytes);
        let mut starts: Vec<u64> = Vec::with_capacity(self.rows.len());
        for row in &self.rows {
            inside("the parity block", row.parity, block)?;
            starts.push(row.parity);
            for t in &row.terms {
                inside("a term's range", t.a, u64::from(t.len))?;
                if let Some(b) = t.b {
                    inside("a term's range", b, u64::from(t.len))?;
                }
            }
        }
        starts.sort_unstable();
        if let Some(w) = starts.windows(2).find(|w| w[1] - w[0] < block) {
            return Err(format!(
                "two rows of the fold overlap (parity blocks at {} and {})",
                w[0], w[1]
            ));
        }
        Ok(())
    }
}

/// Runs `fold` on `dev`: reads every row's parity and checks it against
/// its expected checksum, reads the terms' ranges of the rows that match
/// ([`FOLD_READ_WINDOW`] at a time, in one batch each), computes
/// ([`crate::codec::mul_xor`]), writes the folded rows in one batch (and
/// syncs the device when `fua`), and answers each row. An error (a check
/// that fails, a term's read, a write) is returned as the whole fold's;
/// only a write error may leave rows written.
pub fn run(dev: &dyn Device, fold: &Fold, fua: bool) -> io::Result<Vec<RowAnswer>> {
    fold.check(dev.size())
        .map_err(|why| io::Error::new(io::ErrorKind::InvalidInput, why))?;
    let block = fold.block_bytes as usize;
    let mut parity: Vec<Vec<u8>> = fold.rows.iter().map(|_| vec![0u8; block]).collect();
    let results = {
        let mut ios: Vec<DeviceIo> = parity
            .iter_mut()
            .zip(&fold.rows)
            .map(|(buf, row)| DeviceIo {
                dev,
                op: Op::Read {
                    buf,
                    offset: row.parity,
                },
            })
            .collect();
        submit(&mut ios).0
    };
    let mut answers: Vec<Option<RowAnswer>> = results
        .iter()
        .zip(&parity)
        .zip(&fold.rows)
        .map(|((r, buf), row)| match r {
            Err(_) => Some(RowAnswer::Unreadable),
            Ok(()) => {
                let crc32c = crate::codec::crc32c(buf);
                (crc32c != row.expected_crc32c).then_some(RowAnswer::Mismatch { crc32c })
            }
        })
        .collect();
    // Every term of a row that matched, in order, as (row, term).
    let work: Vec<(usize, &Term)> = fold
        .rows
        .iter()
        .enumerate()
        .filter(|(i, _)| answers[*i].is_none())
        .flat_map(|(i, row)| row.terms.iter().map(move |t| (i, t)))
        .collect();
    let per_window = (FOLD_READ_WINDOW / 2).max(1);
    for window in work.chunks(per_window) {
        let mut a: Vec<Vec<u8>> = window
            .iter()
            .map(|(_, t)| vec![0u8; t.len as usize])
            .collect();
        let mut b: Vec<Vec<u8>> = window
            .iter()
            .map(|(_, t)| vec![0u8; if t.b.is_some() { t.len as usize } else { 0 }])
            .collect();
        let results = {
            let mut ios: Vec<DeviceIo> = Vec::with_capacity(2 * window.len());
            for ((abuf, bbuf), (_, t)) in a.iter_mut().zip(b.iter_mut()).zip(window) {
                ios.push(DeviceIo {
                    dev,
                    op: Op::Read {
                        buf: abuf,
                        offset: t.a,
                    },
                });
                if let Some(at) = t.b {
                    ios.push(DeviceIo {
                        dev,
                        op: Op::Read {
                            buf: bbuf,
                            offset: at,
                        },
                    });
                }
            }
            submit(&mut ios).0
        };
        results.into_iter().collect::<io::Result<()>>()?;
        for ((abuf, bbuf), &(i, t)) in a.iter_mut().zip(&b).zip(window) {
            for (x, y) in abuf.iter_mut().zip(bbuf) {
                *x ^= y;
            }
            let at = t.at as usize;
            crate::codec::mul_xor(t.coefficient, abuf, &mut parity[i][at..at + abuf.len()]);
        }
    }
    let hint = WriteHint::new(IoClass::Parity);
    let folded: Vec<usize> = (0..fold.rows.len())
        .filter(|&i| answers[i].is_none())
        .collect();
    if !folded.is_empty() {
        let mut ios: Vec<DeviceIo> = folded
            .iter()
            .map(|&i| DeviceIo {
                dev,
                op: Op::Write {
                    buf: &parity[i],
                    offset: fold.rows[i].parity,
                    hint,
                    fua: false,
                },
            })
            .collect();
        submit(&mut ios).0.into_iter().collect::<io::Result<()>>()?;
        if fua {
            // After the writes completed: a sync in their batch would not
            // be ordered after them on the ring.
            dev.sync()?;
        }
    }
    for i in folded {
        answers[i] = Some(RowAnswer::Folded {
            crc32c: crate::codec::crc32c(&parity[i]),
        });
    }
    Ok(answers
        .into_iter()
        .map(|a| a.expect("every row answered"))
        .collect())
}

#[cfg(test)]
mod tests;
