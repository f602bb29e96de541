//! Leases and self-fencing.
//!
//! A chunk server's registration and a volume's writer key live under an
//! etcd lease. etcd deletes the keys when the lease expires, and another
//! process may then take the id or the volume: from that moment the old
//! holder must not acknowledge another write. The holder cannot learn of
//! the expiry from etcd (it may be cut off), so it keeps its own,
//! conservative clock: [`LeaseClock`], a state machine with no clock of
//! its own (times are given to it), renews at a third of the TTL and
//! declares the lease lost a quarter of the TTL *before* the earliest
//! moment etcd may expire it. That moment is counted from when the last
//! answered renewal was *sent* (etcd renews on receipt, later), so a slow
//! answer only makes the holder fence earlier, never later.
//!
//! [`Lease`] runs the clock in a tokio task that renews over etcd (failing
//! over between endpoints: a renewal unanswered within an eighth of the
//! TTL moves the keeper to another endpoint, so a member that stops
//! answering with its connections open costs one such wait, not the
//! whole window up to the fence) and raises the [`Fence`] signal once: when the
//! deadline passes without a renewal, or when etcd answers that the lease
//! is gone (revoked, or expired). A fenced holder stops acknowledging
//! writes and exits non-zero (`chunkd`), or stops its export (the volume
//! writer); the lease is never re-granted under it.

use crate::error::{Error, Result};
use crate::session::{Etcd, Failover};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// A lease's state as its holder sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseState {
    Live,
    /// The holder must stop: the reason says why.
    Fenced(String),
}

/// The holder's view of one lease's expiry, in milliseconds of a monotonic
/// clock with an arbitrary origin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseClock {
    ttl_ms: u64,
    /// Send time of the last answered renewal (or of the grant).
    renewed_sent_ms: u64,
    /// The earliest time etcd may expire the lease.
    expires_ms: u64,
}

/// Shortest TTL a lease may have (etcd's own minimum is about 1.5 s).
pub const LEASE_TTL_MIN: Duration = Duration::from_secs(2);

impl LeaseClock {
    /// A lease granted with `ttl_s` by a request sent at `sent_ms`.
    pub fn granted(sent_ms: u64, ttl_s: u64) -> LeaseClock {
        let ttl_ms = ttl_s.saturating_mul(1000);
        LeaseClock {
            ttl_ms,
            renewed_sent_ms: sent_ms,
            expires_ms: sent_ms.saturating_add(ttl_ms),
        }
    }

    /// When the next renewal is due.
    pub fn renew_at_ms(&self) -> u64 {
        self.renewed_sent_ms + self.ttl_ms / 3
    }

    /// Past this time the holder must act as if the lease were lost.
    pub fn fence_at_ms(&self) -> u64 {
        self.expires_ms - self.ttl_ms / 4
    }

    /// A renewal sent at `sent_ms` was answered with `ttl_s` (0: etcd no
    /// longer knows the lease). Answers arriving out of order never move
    /// the deadline back.
    pub fn on_renewed(&mut self, sent_ms: u64, ttl_s: i64) -> LeaseState {
        if ttl_s <= 0 {
            return LeaseState::Fenced(
                "etcd answered that the lease is gone (revoked or expired)".into(),
            );
        }
        let ttl_ms = (ttl_s as u64).saturating_mul(1000);
        if sent_ms >= self.renewed_sent_ms {
            self.renewed_sent_ms = sent_ms;
            self.ttl_ms = ttl_ms;
            self.expires_ms = self.expires_ms.max(sent_ms.saturating_add(ttl_ms));
        }
        LeaseState::Live
    }

    /// The state at `now_ms`.
    pub fn state_at(&self, now_ms: u64) -> LeaseState {
        if now_ms >= self.fence_at_ms() {
            LeaseState::Fenced(format!(
                "the lease was not renewed in time (ttl {} ms, last renewal sent {} ms ago)",
                self.ttl_ms,
                now_ms.saturating_sub(self.renewed_sent_ms)
            ))
        } else {
            LeaseState::Live
        }
    }
}

/// The receiving side of a lease's fence signal (cheap to clone).
#[derive(Clone, Debug)]
pub struct Fence {
    rx: watch::Receiver<LeaseState>,
    /// The clock's fence time ([`LeaseClock::fence_at_ms`]) as the keeper
    /// last moved it, on the boot clock ([`boot_ms`]): read at each use,
    /// so a holder paused past it (SIGSTOP, or a host suspended, which
    /// stops the monotonic clock the keeper sleeps on but not this one)
    /// sees the lease as lost before its keeper task has run again.
    fence_at_boot_ms: Arc<AtomicU64>,
}

/// Milliseconds of `CLOCK_BOOTTIME`: monotonic, and counting a suspend
/// (`None` if the clock cannot be read).
fn boot_ms() -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given; CLOCK_BOOTTIME
    // exists on every Linux this builds for.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    if rc != 0 {
        return None;
    }
    Some((ts.tv_sec as u64) * 1000 + (ts.tv_nsec as u64) / 1_000_000)
}

/// The boot-clock time of the lease clock's `fence_at_ms`, for a renewal
/// (or grant) sent at `sent_ms` on the lease clock and `sent_boot` on the
/// boot clock (both read before the request went out, so a suspend while
/// it was in flight counts against the lease); 0 (lost) without a boot
/// clock.
fn fence_at_boot(fence_at_ms: u64, sent_ms: u64, sent_boot: Option<u64>) -> u64 {
    sent_boot.map_or(0, |boot| {
        boot.saturating_add(fence_at_ms.saturating_sub(sent_ms))
    })
}

impl Fence {
    /// Whether the lease may still be counted live at this instant: not
    /// fenced, and the keeper's last fence time not yet passed. A holder
    /// checks it before it acknowledges a write (`chunkd`).
    pub fn live_now(&self) -> bool {
        self.reason().is_none()
            && boot_ms().is_some_and(|now| now < self.fence_at_boot_ms.load(Ordering::SeqCst))
    }

    /// Why the holder is fenced, or `None` while the lease is live.
    pub fn reason(&self) -> Option<String> {
        match &*self.rx.borrow() {
            LeaseState::Live => None,
            LeaseState::Fenced(reason) => Some(reason.clone()),
        }
    }

    /// Waits until the holder is fenced, and says why.
    pub async fn fenced(&mut self) -> String {
        loop {
            if let Some(reason) = self.reason() {
                return reason;
            }
            if self.rx.changed().await.is_err() {
                // The keeper is gone (its `Lease` dropped): nobody renews.
                return self
                    .reason()
                    .unwrap_or_else(|| "the lease keeper stopped".into());
            }
        }
    }
}

/// A granted lease, renewed by a background task until dropped, revoked,
/// or fenced.
#[derive(Debug)]
pub struct Lease {
    id: i64,
    ttl_s: u64,
    fence: Fence,
    keeper: tokio::task::JoinHandle<()>,
    etcd: Etcd,
}

impl Lease {
    /// Grants a lease of `ttl` (at least [`LEASE_TTL_MIN`], whole seconds)
    /// and starts renewing it.
    pub async fn grant(etcd: &Etcd, ttl: Duration) -> Result<Lease> {
        if ttl < LEASE_TTL_MIN {
            return Err(Error::invalid(
                "lease ttl",
                format!("{ttl:?} is below the minimum {LEASE_TTL_MIN:?}"),
            ));
        }
        let origin = Instant::now();
        let sent_ms = 0;
        let sent_boot = boot_ms();
        let granted = etcd
            .client()
            .lease_grant(ttl.as_secs() as i64, None)
            .await
            .map_err(Error::etcd("lease grant"))?;
        let ttl_s = granted.ttl().max(0) as u64;
        let clock = LeaseClock::granted(sent_ms, ttl_s);
        let (tx, rx) = watch::channel(LeaseState::Live);
        let fence_at_boot_ms = Arc::new(AtomicU64::new(fence_at_boot(
            clock.fence_at_ms(),
            sent_ms,
            sent_boot,
        )));
        let keeper = tokio::spawn(keep(
            etcd.clone(),
            granted.id(),
            clock,
            origin,
            tx,
            Arc::clone(&fence_at_boot_ms),
        ));
        Ok(Lease {
            id: granted.id(),
            ttl_s,
            fence: Fence {
                rx,
                fence_at_boot_ms,
            },
            keeper,
            etcd: etcd.clone(),
        })
    }

    /// The lease's id in etcd.
    pub fn id(&self) -> i64 {
        self.id
    }

    /// The TTL etcd granted, in seconds.
    pub fn ttl_s(&self) -> u64 {
        self.ttl_s
    }

    /// The fence signal.
    pub fn fence(&self) -> Fence {
        self.fence.clone()
    }

    /// Stops renewing and revokes the lease: its keys go at once (a clean
    /// shutdown; dropping the `Lease` instead lets them go at the TTL).
    pub async fn revoke(self) -> Result<()> {
        self.keeper.abort();
        self.etcd
            .client()
            .lease_revoke(self.id)
            .await
            .map_err(Error::etcd("lease revoke"))?;
        Ok(())
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

/// Pause between failed renewal attempts.
fn retry_delay(ttl_ms: u64) -> Duration {
    Duration::from_millis((ttl_ms / 10).clamp(100, 1000))
}

/// Longest wait for one renewal (or for one endpoint to connect and
/// answer): an eighth of the TTL, between 250 ms and 2 s. The window from
/// a renewal's due time (a third of the TTL) to the fence (three quarters)
/// is five twelfths of the TTL, so an endpoint that accepts but no longer
/// answers (a stopped or partitioned etcd member, or one whose cluster is
/// electing a leader) costs one such wait, and the keeper still has about
/// two more tries on the other endpoints before it must fence.
fn attempt_timeout(ttl_ms: u64) -> Duration {
    Duration::from_millis((ttl_ms / 8).clamp(250, 2000))
}

/// The keeper task: renews at the clock's times until fenced.
async fn keep(
    etcd: Etcd,
    id: i64,
    mut clock: LeaseClock,
    origin: Instant,
    tx: watch::Sender<LeaseState>,
    fence_at_boot_ms: Arc<AtomicU64>,
) {
    let now_ms = || origin.elapsed().as_millis() as u64;
    let at = |ms: u64| origin + Duration::from_millis(ms);
    let mut stream = None;
    let fenced = loop {
        if let LeaseState::Fenced(reason) = clock.state_at(now_ms()) {
            break reason;
        }
        let fence_at = at(clock.fence_at_ms());
        let attempt = attempt_timeout(clock.ttl_ms);
        if stream.is_none() {
            let open = async { etcd.client().lease_keep_alive(id).await };
            let deadline = fence_at.min(Instant::now() + attempt);
            match tokio::time::timeout_at(deadline, open).await {
                Ok(Ok(pair)) => stream = Some(pair),
                Ok(Err(_)) => {
                    let reconnect = etcd.reconnect_within(Failover::SameFirst, attempt);
                    let _ = tokio::time::timeout_at(fence_at, reconnect).await;
                    tokio::time::sleep(retry_delay(clock.ttl_ms).min(attempt)).await;
                }
                // No answer in time: leave that endpoint for last.
                Err(_) => {
                    let reconnect = etcd.reconnect_within(Failover::OthersFirst, attempt);
                    let _ = tokio::time::timeout_at(fence_at, reconnect).await;
                }
            }
            continue;
        }
        tokio::time::sleep_until(at(clock.renew_at_ms()).min(fence_at)).await;
        if now_ms() >= clock.fence_at_ms() {
            continue;
        }
        let Some((keeper, responses)) = stream.as_mut() else {
            continue;
        };
        let sent_ms = now_ms();
        let sent_boot = boot_ms();
        let renewal = async {
            keeper.keep_alive().await?;
            responses.message().await
        };
        let deadline = fence_at.min(Instant::now() + attempt);
        match tokio::time::timeout_at(deadline, renewal).await {
            Ok(Ok(Some(answer))) => {
                if let LeaseState::Fenced(reason) = clock.on_renewed(sent_ms, answer.ttl()) {
                    break reason;
                }
                // The clock's fence time may come from an earlier renewal
                // (an answer out of order): never moved back.
                fence_at_boot_ms.fetch_max(
                    fence_at_boot(clock.fence_at_ms(), sent_ms, sent_boot),
                    Ordering::SeqCst,
                );
            }
            Ok(Ok(None)) | Ok(Err(_)) => {
                // The stream broke: find a live endpoint and open a new one.
                stream = None;
                let reconnect = etcd.reconnect_within(Failover::SameFirst, attempt);
                let _ = tokio::time::timeout_at(fence_at, reconnect).await;
                tokio::time::sleep(retry_delay(clock.ttl_ms).min(attempt)).await;
            }
            Err(_) => {
                // No answer in time: the endpoint may have stopped answering
                // while its connection stays open. Try another at once; a
                // late answer on the dropped stream is lost, which only
                // makes the holder fence earlier, never later.
                stream = None;
                let reconnect = etcd.reconnect_within(Failover::OthersFirst, attempt);
                let _ = tokio::time::timeout_at(fence_at, reconnect).await;
            }
        }
    };
    fence_at_boot_ms.store(0, Ordering::SeqCst);
    let _ = tx.send(LeaseState::Fenced(fenced));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_is_due_at_a_third_and_fencing_a_quarter_before_expiry() {
        let clock = LeaseClock::granted(1_000, 6);
        assert_eq!(clock.renew_at_ms(), 3_000);
        assert_eq!(clock.fence_at_ms(), 5_500);
        assert_eq!(clock.state_at(5_499), LeaseState::Live);
        assert!(matches!(clock.state_at(5_500), LeaseState::Fenced(_)));
    }

    #[test]
    fn expiry_counts_from_when_the_renewal_was_sent_not_answered() {
        let mut clock = LeaseClock::granted(0, 6);
        // Sent at 2 s, answered whenever: etcd may expire it at 8 s.
        assert_eq!(clock.on_renewed(2_000, 6), LeaseState::Live);
        assert_eq!(clock.fence_at_ms(), 6_500);
        assert_eq!(clock.renew_at_ms(), 4_000);
    }

    #[test]
    fn a_late_answer_to_an_older_renewal_never_moves_the_deadline_back() {
        let mut clock = LeaseClock::granted(0, 6);
        clock.on_renewed(4_000, 6);
        clock.on_renewed(2_000, 6);
        assert_eq!(clock.fence_at_ms(), 8_500);
    }

    /// A holder paused past its fence time (its keeper task not run
    /// since) sees the lease lost at its next check.
    #[test]
    fn a_fence_time_passed_counts_as_lost_before_the_keeper_runs() {
        let (_tx, rx) = watch::channel(LeaseState::Live);
        let fence = |at_boot_ms: u64| Fence {
            rx: rx.clone(),
            fence_at_boot_ms: Arc::new(AtomicU64::new(at_boot_ms)),
        };
        let now = boot_ms().expect("a boot clock");
        assert!(fence(now + 60_000).live_now());
        assert!(!fence(now - 1).live_now(), "past its fence time");
        // A fence time 50 s ahead of a renewal sent at 10 s on the lease
        // clock and at `now` on the boot clock: 40 s after `now`.
        assert_eq!(fence_at_boot(50_000, 10_000, Some(now)), now + 40_000);
        // No boot clock: lost.
        assert_eq!(fence_at_boot(50_000, 10_000, None), 0);
        assert!(!fence(0).live_now());
        let (tx, rx) = watch::channel(LeaseState::Live);
        let fenced = Fence {
            rx,
            fence_at_boot_ms: Arc::new(AtomicU64::new(now + 60_000)),
        };
        tx.send(LeaseState::Fenced("gone".into())).unwrap();
        assert!(!fenced.live_now(), "fenced");
    }

    #[test]
    fn a_ttl_of_zero_means_the_lease_is_gone() {
        let mut clock = LeaseClock::granted(0, 6);
        assert!(matches!(clock.on_renewed(1_000, 0), LeaseState::Fenced(_)));
        assert!(matches!(clock.on_renewed(1_000, -1), LeaseState::Fenced(_)));
    }

    #[test]
    fn without_renewals_the_holder_fences_before_etcd_can_expire_the_lease() {
        let clock = LeaseClock::granted(0, 2);
        let expires = 2_000;
        assert!(clock.fence_at_ms() < expires);
        assert!(matches!(
            clock.state_at(clock.fence_at_ms()),
            LeaseState::Fenced(_)
        ));
    }
}
