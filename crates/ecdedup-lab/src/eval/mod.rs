//! Experiments that reproduce the papers' evaluations on real data.
//!
//! `ecdedup eval parity-dedup` (paper 000) builds one array per RAID chunk
//! size and dedup policy, serves it with `ecdedup serve` (nbdkit), writes the
//! workload onto it (through ext4 on `nbdfuse` + a loop device, and as one
//! raw sequential stream over NBD), reads the counters back through the
//! control socket, times degraded reads with one and two devices failed, and
//! prints the paper's figures beside ours.
//!
//! `ecdedup eval codeplugin` (paper 001) seals a workload into archives of
//! plain RS and CodePlugin (no exchange, 2-EX, 4-EX) and reports Table 1 and
//! Figures 4 to 7 beside the paper's ([`codeplugin`]).
//!
//! `ecdedup eval block-separation` (paper 003) replays block traces captured
//! by `serve --trace` on simulated SSDs ([`block_separation`]).
//!
//! Modules: [`parity_dedup`] runs the experiment; [`proc`] holds the guards
//! that start and always stop the server, nbdfuse, the loop device and the
//! mount (by PID, with timeouts); [`nbd`] is a small sequential NBD client;
//! [`report`] and [`svg`] render the results.

pub mod block_separation;
pub mod codeplugin;
pub mod nbd;
pub mod parity_dedup;
pub mod proc;
pub mod report;
pub mod results;
pub mod svg;

use ecdedup_core::error::Result;

/// The verdict on a goal from every round's value (a count: its one
/// value): "met" only when every value clears the goal, so that the whole
/// min-max range does; "**missed**" when none does; "inconclusive" when the
/// range straddles it (noise decides) or there is no value. `clears` says
/// whether one value meets the goal.
pub fn goal_verdict(values: &[f64], clears: impl Fn(f64) -> bool) -> &'static str {
    let cleared = values.iter().filter(|&&v| clears(v)).count();
    if values.is_empty() || (cleared > 0 && cleared < values.len()) {
        "inconclusive"
    } else if cleared == values.len() {
        "met"
    } else {
        "**missed**"
    }
}

#[derive(clap::Subcommand)]
pub enum EvalCommand {
    /// Paper 000: plain RAID-6 vs + data dedup vs + parity dedup, through ext4.
    ParityDedup(parity_dedup::Options),
    /// Paper 003: GC page copies and write latency of SSDs with no, inline,
    /// offline and separated offline dedup, over captured block traces.
    BlockSeparation(block_separation::Options),
    /// Paper 001: parity saved and encode throughput of CodePlugin (dedup
    /// before Reed-Solomon) against plain RS, on the archive tier.
    Codeplugin(codeplugin::Options),
}

pub fn run(cmd: EvalCommand) -> Result<()> {
    match cmd {
        EvalCommand::ParityDedup(opts) => parity_dedup::run(opts),
        EvalCommand::BlockSeparation(opts) => block_separation::run(opts),
        EvalCommand::Codeplugin(opts) => codeplugin::run(opts),
    }
}
