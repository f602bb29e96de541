//! Placement, as pure functions: which servers hold a PG, and which PG
//! holds a stripe of a volume. No etcd, no clock: the same inputs give the
//! same answer on every machine and in every version (the hash is written
//! out here, not `std`'s, whose output may change between releases).
//!
//! - [`place_pgs`]: each PG gets `k + m` servers on distinct failure
//!   domains, chosen by rendezvous (highest-random-weight) hashing over the
//!   servers registered when the pool is created, so the choice depends on
//!   the set of servers, not on the order they were listed in.
//! - [`stripe_pg`]: stripe `s` of volume `v` lives in PG
//!   `mix(v, s) mod pg_count`: a function of the volume's id and the
//!   stripe number (and the pool's fixed PG count) only, so creating,
//!   resizing or removing other volumes never moves a volume's data.

use crate::error::{Error, Result};
use crate::keys::{FailureDomain, PgRecord, PoolSpec, ServerId};
use std::collections::{BTreeMap, BTreeSet};

/// A server that placement may choose.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub id: ServerId,
    /// The failure domain `host`.
    pub host: String,
}

/// SplitMix64's finalizer: a bijective 64-bit mix.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// FNV-1a over bytes (the pool name's part of a PG's seed).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xCBF2_9CE4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

/// The PG of stripe `stripe` of volume `volume_id` in a pool of `pg_count`
/// PGs (`pg_count >= 1`).
pub fn stripe_pg(volume_id: u64, stripe: u64, pg_count: u32) -> u32 {
    assert!(pg_count > 0, "a pool has at least one PG");
    let h = mix(mix(volume_id) ^ stripe);
    (h % u64::from(pg_count)) as u32
}

/// The servers of every PG of pool `pool` (index = PG number), at epoch 1.
pub fn place_pgs(pool: &str, spec: &PoolSpec, servers: &[Candidate]) -> Result<Vec<PgRecord>> {
    let width = spec.width() as usize;
    let mut ids = BTreeSet::new();
    for s in servers {
        if !ids.insert(s.id) {
            return Err(Error::Placement(format!("server {} is listed twice", s.id)));
        }
    }
    let domain = |s: &Candidate| match spec.failure_domain {
        FailureDomain::Host => s.host.clone(),
        FailureDomain::Device => s.id.to_string(),
    };
    let domains: BTreeSet<String> = servers.iter().map(domain).collect();
    if domains.len() < width {
        return Err(Error::Placement(format!(
            "pool {pool} needs k + m = {width} servers on distinct {} failure domains, \
             and the {} registered servers span {}",
            match spec.failure_domain {
                FailureDomain::Host => "host",
                FailureDomain::Device => "device",
            },
            servers.len(),
            domains.len()
        )));
    }
    let pgs = (0..spec.pg_count)
        .map(|pg| {
            let mut ranked: Vec<(u64, &Candidate)> = servers
                .iter()
                .map(|s| (weight(pool, pg, s.id), s))
                .collect();
            // Highest weight first; the id breaks (improbable) ties, so the
            // input order never matters.
            ranked.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.id.cmp(&b.1.id)));
            let mut used = BTreeSet::new();
            let chosen: Vec<ServerId> = ranked
                .into_iter()
                .filter(|(_, s)| used.insert(domain(s)))
                .map(|(_, s)| s.id)
                .take(width)
                .collect();
            debug_assert_eq!(chosen.len(), width, "enough domains were checked above");
            PgRecord {
                servers: chosen,
                epoch: 1,
            }
        })
        .collect();
    Ok(pgs)
}

/// The weight of server `id` for PG `pg` of pool `pool` (rendezvous).
fn weight(pool: &str, pg: u32, id: ServerId) -> u64 {
    let pg_seed = mix(fnv1a(pool.as_bytes()) ^ u64::from(pg));
    mix(pg_seed ^ mix(u64::from(id.0)))
}

/// The replacements of PG `pg`'s shards whose servers are `out`: for each
/// such shard, in shard order, the live candidate of highest weight
/// (the rendezvous hash of [`place_pgs`]) that is not in the PG and whose
/// failure domain no kept or already chosen server of the PG has.
/// `hosts` gives the `host` of every server known (the kept ones may be
/// down, and absent from `live`); a kept server of unknown host counts
/// as its own domain. Returns `(shard, from, to)` per shard placed; a
/// shard for which no candidate fits is left out (the caller logs it and
/// the PG stays degraded).
pub fn replace_shards(
    pool: &str,
    spec: &PoolSpec,
    pg: u32,
    servers: &[ServerId],
    out: &BTreeSet<ServerId>,
    hosts: &BTreeMap<ServerId, String>,
    live: &[Candidate],
) -> Vec<(u32, ServerId, ServerId)> {
    let domain_of = |id: ServerId, host: Option<&String>| match (spec.failure_domain, host) {
        (FailureDomain::Host, Some(h)) => h.clone(),
        _ => format!("server {id}"),
    };
    let mut used: BTreeSet<String> = servers
        .iter()
        .filter(|id| !out.contains(id))
        .map(|&id| domain_of(id, hosts.get(&id)))
        .collect();
    let mut taken: BTreeSet<ServerId> = servers.iter().copied().collect();
    let mut ranked: Vec<&Candidate> = live.iter().collect();
    ranked.sort_by(|a, b| {
        weight(pool, pg, b.id)
            .cmp(&weight(pool, pg, a.id))
            .then(a.id.cmp(&b.id))
    });
    let mut moves = Vec::new();
    for (shard, &from) in servers.iter().enumerate() {
        if !out.contains(&from) {
            continue;
        }
        let pick = ranked.iter().find(|c| {
            !taken.contains(&c.id)
                && !out.contains(&c.id)
                && !used.contains(&domain_of(c.id, Some(&c.host)))
        });
        if let Some(c) = pick {
            taken.insert(c.id);
            used.insert(domain_of(c.id, Some(&c.host)));
            moves.push((shard as u32, from, c.id));
        }
    }
    moves
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{DedupPolicy, WritePolicy};
    use proptest::prelude::*;

    fn spec(k: u32, m: u32, pg_count: u32, failure_domain: FailureDomain) -> PoolSpec {
        PoolSpec {
            k,
            m,
            stripe_unit_bytes: 65536,
            policy: WritePolicy::Parix,
            dedup: DedupPolicy::None,
            pg_count,
            failure_domain,
            min_size: None,
            journal_bytes: None,
        }
    }

    fn servers(count: u32, hosts: u32) -> Vec<Candidate> {
        (0..count)
            .map(|i| Candidate {
                id: ServerId(i * 3 + 1),
                host: format!("host{}", i % hosts),
            })
            .collect()
    }

    proptest! {
        #[test]
        fn a_stripe_maps_to_the_same_pg_whatever_other_volumes_exist(
            volume in any::<u64>(),
            stripes in proptest::collection::vec(any::<u64>(), 1..32),
            others in proptest::collection::btree_set(any::<u64>(), 0..16),
            pg_count in 1u32..=PG_COUNT_MAX_TEST,
        ) {
            // The mapping of a pool with `volume` alone, then with other
            // volumes created (and every one of them mapped) around it.
            let alone: Vec<u32> = stripes.iter().map(|&s| stripe_pg(volume, s, pg_count)).collect();
            for &other in &others {
                for &s in &stripes {
                    prop_assert!(stripe_pg(other, s, pg_count) < pg_count);
                }
            }
            let crowded: Vec<u32> = stripes.iter().map(|&s| stripe_pg(volume, s, pg_count)).collect();
            prop_assert_eq!(&alone, &crowded);
            prop_assert!(alone.iter().all(|&pg| pg < pg_count));
        }

        #[test]
        fn every_pg_gets_width_servers_on_distinct_domains_whatever_the_listing_order(
            count in 6u32..24,
            hosts in 6u32..24,
            k in 1u32..5,
            m in 1u32..3,
            pg_count in 1u32..64,
            host_domain in any::<bool>(),
            rotate in 0usize..24,
        ) {
            let domain = if host_domain { FailureDomain::Host } else { FailureDomain::Device };
            let spec = spec(k, m, pg_count, domain);
            let list = servers(count, hosts);
            let pgs = place_pgs("p", &spec, &list).unwrap();
            prop_assert_eq!(pgs.len(), pg_count as usize);
            for pg in &pgs {
                prop_assert_eq!(pg.servers.len(), (k + m) as usize);
                let mut seen = BTreeSet::new();
                for id in &pg.servers {
                    let s = list.iter().find(|s| s.id == *id).unwrap();
                    let d = if host_domain { s.host.clone() } else { s.id.to_string() };
                    prop_assert!(seen.insert(d), "two shards of a PG share a domain");
                }
            }
            let mut rotated = list.clone();
            rotated.rotate_left(rotate % list.len());
            rotated.reverse();
            prop_assert_eq!(place_pgs("p", &spec, &rotated).unwrap(), pgs);
        }
    }

    const PG_COUNT_MAX_TEST: u32 = crate::keys::PG_COUNT_MAX;

    #[test]
    fn stripes_spread_evenly_over_the_pgs() {
        let pg_count = 64u32;
        let mut per_pg = vec![0u32; pg_count as usize];
        for volume in 1..=4u64 {
            for stripe in 0..16_384u64 {
                per_pg[stripe_pg(volume, stripe, pg_count) as usize] += 1;
            }
        }
        // 1024 expected per PG; a fair hash stays well within a quarter.
        let (min, max) = (per_pg.iter().min().unwrap(), per_pg.iter().max().unwrap());
        assert!(*min > 768 && *max < 1280, "min {min}, max {max}");
    }

    #[test]
    fn servers_share_the_pgs_evenly() {
        let list = servers(12, 12);
        let pgs = place_pgs("p", &spec(4, 2, 256, FailureDomain::Host), &list).unwrap();
        // 256 * 6 / 12 = 128 shards per server expected.
        for s in &list {
            let n = pgs.iter().filter(|pg| pg.servers.contains(&s.id)).count();
            assert!((64..=192).contains(&n), "server {} holds {n} shards", s.id);
        }
    }

    #[test]
    fn too_few_failure_domains_is_an_error_that_counts_them() {
        let list = servers(8, 3);
        let err = place_pgs("p", &spec(4, 2, 8, FailureDomain::Host), &list).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("6 servers") && text.contains("span 3"),
            "{text}"
        );
        // The same servers are enough when each server is its own domain.
        place_pgs("p", &spec(4, 2, 8, FailureDomain::Device), &list).unwrap();
    }

    #[test]
    fn an_out_server_is_replaced_on_a_new_domain_and_the_choice_is_stable() {
        let list = servers(9, 9);
        let spec = spec(4, 2, 16, FailureDomain::Host);
        let pgs = place_pgs("p", &spec, &list).unwrap();
        let hosts: BTreeMap<ServerId, String> =
            list.iter().map(|c| (c.id, c.host.clone())).collect();
        for (pg, record) in pgs.iter().enumerate() {
            let gone = record.servers[2];
            let out = BTreeSet::from([gone]);
            let live: Vec<Candidate> = list.iter().filter(|c| c.id != gone).cloned().collect();
            let moves = replace_shards("p", &spec, pg as u32, &record.servers, &out, &hosts, &live);
            assert_eq!(moves.len(), 1);
            let (shard, from, to) = moves[0];
            assert_eq!((shard, from), (2, gone));
            assert!(!record.servers.contains(&to), "a server new to the PG");
            let mut reversed = live.clone();
            reversed.reverse();
            assert_eq!(
                replace_shards(
                    "p",
                    &spec,
                    pg as u32,
                    &record.servers,
                    &out,
                    &hosts,
                    &reversed
                ),
                moves,
                "the listing order does not matter"
            );
        }
        // A host already in the PG is never chosen: the only spare server
        // shares a host with a kept member.
        let record = &pgs[0];
        let mut hosts = hosts.clone();
        let spare: Vec<Candidate> = list
            .iter()
            .filter(|c| !record.servers.contains(&c.id))
            .map(|c| Candidate {
                id: c.id,
                host: list
                    .iter()
                    .find(|k| k.id == record.servers[0])
                    .unwrap()
                    .host
                    .clone(),
            })
            .collect();
        for c in &spare {
            hosts.insert(c.id, c.host.clone());
        }
        let out = BTreeSet::from([record.servers[1]]);
        assert!(replace_shards("p", &spec, 0, &record.servers, &out, &hosts, &spare).is_empty());
    }

    #[test]
    fn a_server_listed_twice_is_refused() {
        let mut list = servers(8, 8);
        list.push(list[0].clone());
        assert!(place_pgs("p", &spec(2, 1, 4, FailureDomain::Host), &list).is_err());
    }
}
