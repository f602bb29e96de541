//! Rebuilding a re-placed shard on its new server (docs/cluster.md,
//! "Down and out").
//!
//! The writer of a volume owns its PG arrays, so it rebuilds its own
//! chunks: at open, a shard whose new chunk was installed as a
//! replacement (`open.rs`), or whose rebuild an earlier writer left
//! part-way (the member is *rebuilding* in the chunks' superblocks, with
//! its durable cursor), is rebuilt by the engine's `Array::rebuild` in a
//! thread of its own while the volume serves. The engine decodes each
//! stripe's unit from the others under the stripe's lock, writes it, and
//! records its cursor (after a flush: the cursor never vouches for a
//! stripe not on the chunk); it marks the shard active only once the
//! last stripe is written and synced. A close stops the rebuild at its
//! next stripe with the cursor recorded, and the next writer resumes
//! there.
//!
//! Throttle: the rebuild sleeps between stripes so that it writes at most
//! `bytes_per_s` to the new server. Progress: the PG array's counters
//! (`rebuilt_stripes`, its operation's `done`/`total`) and
//! `rebuild-progress/<pool>/<pg>/<volume id>` in etcd (written at most
//! once a second, guarded by the writer's epoch; `finished` only after
//! the engine returned success), which `cluster status` shows and the
//! coordinator reads to close the PG's rebuild record.

use crate::link::PgEpoch;
use ecdedup_cluster::keys::RebuildProgress;
use ecdedup_cluster::Etcd;
use ecdedup_core::array::{Array, MemberState, ProgressFn};
use ecdedup_core::error::{Error, Result};
use ecdedup_transport::log::line;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const COMPONENT: &str = "volume-client";
/// Progress reports to etcd, at most this often.
const REPORT_EVERY: Duration = Duration::from_secs(1);

/// What a rebuild needs besides its array.
#[derive(Clone)]
pub struct Context {
    pub etcd: Etcd,
    pub rt: tokio::runtime::Handle,
    pub pool: String,
    pub volume_id: u64,
    pub writer_epoch: u64,
    /// Each PG's epoch as the writer acts on it (index = PG number).
    pub pg_epochs: Vec<Arc<PgEpoch>>,
    /// 0: no throttle.
    pub bytes_per_s: u64,
}

/// A rebuild running in the background.
pub struct Running {
    /// (PG, shard, the stripe it started from).
    pub starts: Vec<(u32, usize, u64)>,
    thread: std::thread::JoinHandle<Result<u64>>,
}

impl Running {
    /// Waits for it: the stripes rebuilt, or why it stopped short.
    pub fn join(self) -> Result<u64> {
        match self.thread.join() {
            Ok(r) => r,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

/// The shards of `array` waiting for a rebuild, with their cursors.
fn rebuilding(array: &Array) -> Vec<(usize, u64)> {
    array
        .status()
        .devices
        .iter()
        .filter_map(|d| match d.state {
            MemberState::Rebuilding { cursor } => Some((d.position, cursor)),
            _ => None,
        })
        .collect()
}

/// Starts a rebuild thread for each PG with a shard to rebuild.
pub fn start(arrays: &[Arc<Array>], ctx: &Context) -> Vec<Running> {
    arrays
        .iter()
        .enumerate()
        .filter_map(|(pg, array)| start_pg(pg as u32, array, ctx))
        .collect()
}

/// Starts a rebuild thread for PG `pg` if it has a shard to rebuild.
pub fn start_pg(pg: u32, array: &Arc<Array>, ctx: &Context) -> Option<Running> {
    let shards = rebuilding(array);
    if shards.is_empty() {
        return None;
    }
    let starts: Vec<(u32, usize, u64)> = shards.iter().map(|&(s, c)| (pg, s, c)).collect();
    for &(_, shard, cursor) in &starts {
        line(
            COMPONENT,
            "rebuild-start",
            &[
                ("volume_id", &ctx.volume_id),
                ("pg", &pg),
                ("shard", &shard),
                ("from_stripe", &cursor),
                ("stripes", &array.rebuild_extent()),
            ],
        );
    }
    let array = Arc::clone(array);
    let ctx = ctx.clone();
    let thread = std::thread::Builder::new()
        .name(format!("ecdedup-rebuild-pg{pg}"))
        .spawn(move || run(&array, pg, &ctx))
        .expect("spawning a rebuild thread");
    Some(Running { starts, thread })
}

/// Re-adds shard `shard` of PG `pg`, its server back with the chunk `dev`
/// it kept, in a thread of its own while the volume serves
/// (`Array::re_add_device`: only the regions written while it was out,
/// and under plog and parix the stripes its journal held). Logged
/// `shard-resynced` (`while_serving=true`) when done; a re-add that stops
/// (the array closing, fewer than k other members in service, a second
/// failure) leaves the shard rebuilding or failed, for the next open.
pub fn start_re_add(
    pg: u32,
    array: &Arc<Array>,
    shard: usize,
    dev: Arc<dyn ecdedup_core::media::Device>,
    ctx: &Context,
) -> Running {
    line(
        COMPONENT,
        "shard-re-add-start",
        &[
            ("volume_id", &ctx.volume_id),
            ("pg", &pg),
            ("shard", &shard),
            ("while_serving", &true),
        ],
    );
    let array = Arc::clone(array);
    let volume_id = ctx.volume_id;
    let thread = std::thread::Builder::new()
        .name(format!("ecdedup-re-add-pg{pg}"))
        .spawn(move || {
            let result = array.re_add_device(shard, dev);
            match &result {
                Ok(units) => line(
                    COMPONENT,
                    "shard-resynced",
                    &[
                        ("volume_id", &volume_id),
                        ("pg", &pg),
                        ("shard", &shard),
                        ("units", units),
                        ("while_serving", &true),
                    ],
                ),
                Err(e) => line(
                    COMPONENT,
                    match array.member_states()[shard] {
                        MemberState::Failed => "shard-stays-failed",
                        _ => "shard-resync-paused",
                    },
                    &[
                        ("volume_id", &volume_id),
                        ("pg", &pg),
                        ("shard", &shard),
                        ("reason", e),
                        ("while_serving", &true),
                    ],
                ),
            }
            result
        })
        .expect("spawning a re-add thread");
    Running {
        starts: vec![(pg, shard, 0)],
        thread,
    }
}

/// Writes PG `pg`'s rebuild progress to etcd (a failure is logged: the
/// record is for operators, the durable cursor is in the chunks).
fn report(ctx: &Context, pg: u32, done: u64, total: u64, finished: bool) {
    let progress = RebuildProgress {
        epoch: ctx
            .pg_epochs
            .get(pg as usize)
            .map_or(0, |e| u64::from(e.get())),
        done,
        total,
        finished,
    };
    let r = ctx
        .rt
        .block_on(ecdedup_cluster::coordinator::report_rebuild_progress(
            &ctx.etcd,
            &ctx.pool,
            pg,
            ctx.volume_id,
            ctx.writer_epoch,
            &progress,
        ));
    if let Err(e) = r {
        line(
            COMPONENT,
            "rebuild-progress-not-recorded",
            &[("pg", &pg), ("reason", &e)],
        );
    }
}

/// Rebuilds PG `pg`'s rebuilding shards, throttled, reporting progress.
fn run(array: &Array, pg: u32, ctx: &Context) -> Result<u64> {
    let unit_bytes = u64::from(array.status().stripe_unit_bytes);
    // (when this run began, the first `done` it saw, the last report)
    let clock: Mutex<Option<(Instant, u64, Instant)>> = Mutex::new(None);
    let progress: ProgressFn = {
        let ctx = ctx.clone();
        Arc::new(move |_op: &str, done: u64, total: u64| {
            let now = Instant::now();
            let (began, first, last) = *clock.lock().unwrap().get_or_insert((now, done, now));
            if ctx.bytes_per_s > 0 {
                // Sleep until this run's bytes fit the rate.
                let bytes = done.saturating_sub(first) * unit_bytes;
                let due = Duration::from_secs_f64(bytes as f64 / ctx.bytes_per_s as f64);
                if let Some(wait) = due.checked_sub(began.elapsed()) {
                    std::thread::sleep(wait);
                }
            }
            if now.duration_since(last) >= REPORT_EVERY || done == first {
                if let Some(c) = clock.lock().unwrap().as_mut() {
                    c.2 = now;
                }
                report(&ctx, pg, done, total, false);
            }
        })
    };
    let result = array.rebuild(Some(progress));
    // The stripes the volume's size reaches (`Array::set_written_extent`),
    // as the engine's own progress counts them.
    let total = array.rebuild_extent();
    match &result {
        Ok(stripes) => {
            report(ctx, pg, total, total, true);
            line(
                COMPONENT,
                "rebuild-done",
                &[
                    ("volume_id", &ctx.volume_id),
                    ("pg", &pg),
                    ("stripes_rebuilt", stripes),
                ],
            );
        }
        Err(e) => {
            let done = rebuilding(array).iter().map(|&(_, c)| c).min().unwrap_or(0);
            report(ctx, pg, done, total, false);
            line(
                COMPONENT,
                "rebuild-stopped",
                &[
                    ("volume_id", &ctx.volume_id),
                    ("pg", &pg),
                    ("cursor", &done),
                    ("reason", e),
                ],
            );
        }
    }
    result.map_err(|e| match e {
        Error::Unavailable(_) | Error::Busy(_) => e,
        e => Error::Unavailable(format!("rebuild of PG {pg}: {e}")),
    })
}
