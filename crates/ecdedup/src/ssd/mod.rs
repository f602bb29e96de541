//! SSD simulator (page-mapped FTL with dedup and block separation). STUB.

use crate::error::{Error, Result};

#[derive(clap::Args)]
pub struct SimArgs {
    /// Trace file to replay.
    pub trace: std::path::PathBuf,
}

pub fn run_sim(args: SimArgs) -> Result<()> {
    let _ = args;
    Err(Error::Other("not implemented yet".into()))
}
