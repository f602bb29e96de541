//! Experiments that reproduce the papers' evaluations on real data. STUB.

use crate::error::{Error, Result};

#[derive(clap::Subcommand)]
pub enum EvalCommand {
    /// Paper 000: plain RAID-6 vs + data dedup vs + parity dedup, through ext4.
    ParityDedup {
        /// Workload files (tar archives extracted one after another).
        workloads: Vec<std::path::PathBuf>,
    },
}

pub fn run(cmd: EvalCommand) -> Result<()> {
    match cmd {
        EvalCommand::ParityDedup { .. } => Err(Error::Other("not implemented yet".into())),
    }
}
