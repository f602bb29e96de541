//! The latency model of the simulated SSD and the histogram its figures go
//! into.
//!
//! [`LatencyModel`] holds one fixed cost per flash or hash operation, in
//! nanoseconds; the FTL adds them up per host write (see `docs/ssd.md` for
//! the formula). Nothing is timed: every latency is modelled, so a run is
//! deterministic and independent of the machine.
//!
//! [`LatencyHistogram`] is log-linear: exact below 128 ns, then 128
//! sub-buckets per power of two, so a quantile is within 1/128 (< 0.8%) of
//! the true value, with a fixed size ([`HISTOGRAM_BUCKETS`] counters)
//! whatever the number or range of samples. The mean and the maximum are
//! exact.

use serde::Serialize;

/// Sub-buckets per power of two: 2^7 = 128.
const SUB_BITS: u32 = 7;
const SUB: u64 = 1 << SUB_BITS;
/// Counters in a histogram: 128 exact values below 128 ns, then 128 per
/// power of two from 2^7 to 2^63.
pub const HISTOGRAM_BUCKETS: usize = (SUB + (64 - SUB_BITS as u64) * SUB) as usize;

/// Modelled cost of each operation, in nanoseconds. Defaults: page read
/// 50 us, page program 500 us, block erase 3 ms (typical MLC NAND figures,
/// the order DiskSim's SSD extension uses), SHA-1 of a page 75 us and
/// CRC32 of a page 6 us (paper 003's figures for an ARM SSD controller).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct LatencyModel {
    pub page_read_ns: u64,
    pub page_program_ns: u64,
    pub block_erase_ns: u64,
    pub sha1_page_ns: u64,
    pub crc32_page_ns: u64,
}

impl Default for LatencyModel {
    fn default() -> Self {
        LatencyModel {
            page_read_ns: 50_000,
            page_program_ns: 500_000,
            block_erase_ns: 3_000_000,
            sha1_page_ns: 75_000,
            crc32_page_ns: 6_000,
        }
    }
}

/// A fixed-size log-linear histogram of latencies in nanoseconds.
#[derive(Clone)]
pub struct LatencyHistogram {
    counts: Vec<u64>,
    samples: u64,
    sum_ns: u128,
    max_ns: u64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram::new()
    }
}

impl std::fmt::Debug for LatencyHistogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LatencyHistogram")
            .field("samples", &self.samples)
            .field("mean_ns", &self.mean_ns())
            .field("max_ns", &self.max_ns)
            .finish()
    }
}

fn bucket_of(ns: u64) -> usize {
    if ns < SUB {
        return ns as usize;
    }
    let exponent = 63 - ns.leading_zeros(); // >= SUB_BITS
    let sub = (ns >> (exponent - SUB_BITS)) - SUB; // 0..SUB
    (SUB + (exponent - SUB_BITS) as u64 * SUB + sub) as usize
}

/// The middle of a bucket's range (its only value below 128 ns).
fn value_of(bucket: usize) -> u64 {
    let b = bucket as u64;
    if b < SUB {
        return b;
    }
    let exponent = (b - SUB) / SUB + SUB_BITS as u64;
    let sub = (b - SUB) % SUB;
    let width = 1u64 << (exponent - SUB_BITS as u64);
    (SUB + sub) * width + (width - 1) / 2
}

impl LatencyHistogram {
    pub fn new() -> LatencyHistogram {
        LatencyHistogram {
            counts: vec![0; HISTOGRAM_BUCKETS],
            samples: 0,
            sum_ns: 0,
            max_ns: 0,
        }
    }

    pub fn record(&mut self, ns: u64) {
        self.counts[bucket_of(ns)] += 1;
        self.samples += 1;
        self.sum_ns += ns as u128;
        self.max_ns = self.max_ns.max(ns);
    }

    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Exact mean, 0 without samples.
    pub fn mean_ns(&self) -> f64 {
        if self.samples == 0 {
            0.0
        } else {
            self.sum_ns as f64 / self.samples as f64
        }
    }

    pub fn max_ns(&self) -> u64 {
        self.max_ns
    }

    /// The value below which a share `q` (0..=1) of the samples lie, within
    /// 1/128; 0 without samples.
    pub fn quantile_ns(&self, q: f64) -> u64 {
        if self.samples == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.samples as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (bucket, &count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return value_of(bucket).min(self.max_ns);
            }
        }
        self.max_ns
    }

    pub fn clear(&mut self) {
        self.counts.iter_mut().for_each(|c| *c = 0);
        self.samples = 0;
        self.sum_ns = 0;
        self.max_ns = 0;
    }

    /// Bytes this histogram holds.
    pub fn memory_bytes(&self) -> u64 {
        (self.counts.capacity() * 8) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_round_trip_within_one_part_in_128() {
        for ns in (0..5_000u64).chain([500_000, 3_000_000, 123_456_789, u64::MAX / 3]) {
            let b = bucket_of(ns);
            assert!(b < HISTOGRAM_BUCKETS);
            let v = value_of(b);
            let err = (v as f64 - ns as f64).abs() / (ns.max(1) as f64);
            assert!(err <= 1.0 / 128.0, "{ns} -> bucket {b} -> {v}");
        }
        assert_eq!(bucket_of(u64::MAX), HISTOGRAM_BUCKETS - 1);
    }

    #[test]
    fn quantiles_of_a_known_mix_come_out_right() {
        let mut h = LatencyHistogram::new();
        for _ in 0..990 {
            h.record(500_000);
        }
        for _ in 0..10 {
            h.record(30_000_000);
        }
        assert_eq!(h.samples(), 1000);
        let p50 = h.quantile_ns(0.5) as f64;
        assert!((p50 - 500_000.0).abs() / 500_000.0 < 1.0 / 128.0);
        let p99 = h.quantile_ns(0.99) as f64;
        assert!((p99 - 500_000.0).abs() / 500_000.0 < 1.0 / 128.0);
        let p999 = h.quantile_ns(0.999) as f64;
        assert!((p999 - 30_000_000.0).abs() / 30_000_000.0 < 1.0 / 128.0);
        assert_eq!(h.max_ns(), 30_000_000);
        assert!((h.mean_ns() - 795_000.0).abs() < 1e-6);
        h.clear();
        assert_eq!(h.quantile_ns(0.99), 0);
    }
}
