//! `ecdedup volume create|ls|resize|rm`: the thin volumes of a cluster's
//! pools, kept in etcd (docs/cluster.md, "etcd keys"). A thin layer over
//! `ecdedup_cluster`: every guard (a name taken, a stale read, a volume a
//! writer holds) is the library's, and its error is printed as it is.

use crate::error::{Error, Result};
use crate::units::{format_size, parse_size};
use clap::{Args, Subcommand};

#[derive(Args)]
pub struct VolumeArgs {
    #[command(flatten)]
    etcd: crate::cluster_cli::EtcdArgs,
    #[command(subcommand)]
    command: VolumeCommand,
}

#[derive(Subcommand)]
enum VolumeCommand {
    /// Create a thin volume POOL/NAME (its id is new, never reused).
    Create {
        /// POOL/NAME.
        volume: String,
        /// Size (a multiple of 4K), e.g. 100G.
        #[arg(long)]
        size: String,
    },
    /// List the volumes of a pool: name, id, size.
    Ls {
        pool: String,
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
    /// Grow volume POOL/NAME (shrinking is refused).
    Resize {
        /// POOL/NAME.
        volume: String,
        #[arg(long)]
        size: String,
    },
    /// Remove volume POOL/NAME (refused while a writer serves it).
    Rm {
        /// POOL/NAME.
        volume: String,
    },
}

/// `POOL/NAME` split in two.
fn pool_and_name(volume: &str) -> Result<(&str, &str)> {
    match volume.split_once('/') {
        Some((pool, name)) if !pool.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((pool, name))
        }
        _ => Err(Error::Config(format!("volume {volume:?} is not POOL/NAME"))),
    }
}

fn cluster_error(e: ecdedup_cluster::Error) -> Error {
    Error::Other(e.to_string())
}

/// Runs one volume command; what it prints goes to `out`.
pub fn run(args: VolumeArgs, out: &mut dyn std::io::Write) -> Result<()> {
    crate::cluster_cli::ignore_sigpipe();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::io("starting the tokio runtime", e))?;
    let text = runtime.block_on(execute(args))?;
    out.write_all(text.as_bytes())
        .map_err(|e| Error::io("writing the output", e))
}

/// Refuses a bad volume path or size before etcd is asked anything.
fn check(command: &VolumeCommand) -> Result<()> {
    match command {
        VolumeCommand::Create { volume, size } | VolumeCommand::Resize { volume, size } => {
            pool_and_name(volume)?;
            parse_size(size)?;
        }
        VolumeCommand::Rm { volume } => {
            pool_and_name(volume)?;
        }
        VolumeCommand::Ls { .. } => {}
    }
    Ok(())
}

/// Runs one volume command against etcd; returns what it prints.
async fn execute(args: VolumeArgs) -> Result<String> {
    check(&args.command)?;
    let etcd = ecdedup_cluster::Etcd::connect(args.etcd.config())
        .await
        .map_err(cluster_error)?;
    let text = match args.command {
        VolumeCommand::Create { volume, size } => {
            let (pool, name) = pool_and_name(&volume)?;
            let record = ecdedup_cluster::create_volume(&etcd, pool, name, parse_size(&size)?)
                .await
                .map_err(cluster_error)?;
            let size = format_size(record.size_bytes);
            format!("created {pool}/{name}: id {}, {size}\n", record.id)
        }
        VolumeCommand::Ls { pool, json } => {
            // A pool that does not exist is said so, not listed as empty.
            ecdedup_cluster::get_pool(&etcd, &pool)
                .await
                .map_err(cluster_error)?;
            let volumes = ecdedup_cluster::list_volumes(&etcd, &pool)
                .await
                .map_err(cluster_error)?;
            if json {
                let rows: Vec<serde_json::Value> = volumes
                    .iter()
                    .map(|(name, v)| {
                        serde_json::json!({
                            "name": name,
                            "id": v.record.id,
                            "size_bytes": v.record.size_bytes,
                        })
                    })
                    .collect();
                format!("{}\n", serde_json::Value::Array(rows))
            } else {
                volumes
                    .iter()
                    .map(|(name, v)| {
                        let size = format_size(v.record.size_bytes);
                        format!("{name}\tid {}\t{size}\n", v.record.id)
                    })
                    .collect()
            }
        }
        VolumeCommand::Resize { volume, size } => {
            let (pool, name) = pool_and_name(&volume)?;
            let record = ecdedup_cluster::resize_volume(&etcd, pool, name, parse_size(&size)?)
                .await
                .map_err(cluster_error)?;
            format!(
                "resized {pool}/{name} to {} (a writer serving it sees the new size at its \
                 next start)\n",
                format_size(record.size_bytes)
            )
        }
        VolumeCommand::Rm { volume } => {
            let (pool, name) = pool_and_name(&volume)?;
            ecdedup_cluster::remove_volume(&etcd, pool, name)
                .await
                .map_err(cluster_error)?;
            format!(
                "removed {pool}/{name}: each chunk server deletes its chunks at its next \
                 space report (a server that is down, when it is back)\n"
            )
        }
    };
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use ecdedup_cluster::keys::{DedupPolicy, FailureDomain, PoolSpec, ServerInfo, WritePolicy};
    use std::time::Duration;

    #[derive(Parser)]
    struct Command {
        #[command(flatten)]
        args: VolumeArgs,
    }

    /// Runs `ecdedup volume ARGS...` and returns what it printed.
    fn volume(endpoint: &str, args: &[&str]) -> Result<String> {
        let mut argv = vec!["volume", "--etcd", endpoint, "--cluster", "cli"];
        argv.extend_from_slice(args);
        let parsed = Command::try_parse_from(argv).map_err(|e| Error::Config(e.to_string()))?;
        let mut out = Vec::new();
        run(parsed.args, &mut out)?;
        Ok(String::from_utf8(out).unwrap())
    }

    #[test]
    fn a_volume_path_is_pool_slash_name() {
        assert_eq!(pool_and_name("p/v").unwrap(), ("p", "v"));
        for bad in ["p", "/v", "p/", "p/v/w", ""] {
            assert!(pool_and_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn volumes_are_created_listed_resized_and_removed_from_the_command_line() {
        let dir = tempfile::tempdir().unwrap();
        let etcd = ecdedup_cluster::LocalEtcd::start(dir.path()).unwrap_or_else(|e| panic!("{e}"));
        let endpoint = etcd.endpoint();
        // A pool on three servers, made through the library (`pool create`
        // is not a command yet).
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _servers = runtime.block_on(async {
            let config = ecdedup_cluster::EtcdConfig::new(vec![endpoint.clone()], "cli");
            let cluster = ecdedup_cluster::Etcd::connect(config).await.unwrap();
            let mut servers = Vec::new();
            for id in 1..=3 {
                let info = ServerInfo {
                    address: format!("127.0.0.1:{id}"),
                    host: "h".into(),
                    devices: vec![],
                    features: vec![],
                };
                servers.push(
                    ecdedup_cluster::register_server(
                        &cluster,
                        ecdedup_cluster::ServerId(id),
                        &info,
                        Duration::from_secs(30),
                    )
                    .await
                    .unwrap(),
                );
            }
            let spec = PoolSpec {
                k: 2,
                m: 1,
                stripe_unit_bytes: 65536,
                policy: WritePolicy::Rmw,
                dedup: DedupPolicy::None,
                pg_count: 4,
                failure_domain: FailureDomain::Device,
                min_size: None,
                journal_bytes: None,
            };
            ecdedup_cluster::create_pool(&cluster, "p", &spec)
                .await
                .unwrap();
            servers
        });
        assert!(volume(&endpoint, &["create", "p/a", "--size", "1G"])
            .unwrap()
            .contains("id 1"));
        volume(&endpoint, &["create", "p/b", "--size", "2G"]).unwrap();
        let taken = volume(&endpoint, &["create", "p/a", "--size", "1G"]).unwrap_err();
        assert!(taken.to_string().contains("already exists"), "{taken}");
        volume(&endpoint, &["resize", "p/a", "--size", "3G"]).unwrap();
        let listed: serde_json::Value =
            serde_json::from_str(&volume(&endpoint, &["ls", "p", "--json"]).unwrap()).unwrap();
        assert_eq!(listed[0]["name"], "a");
        assert_eq!(listed[0]["size_bytes"], 3u64 << 30);
        assert_eq!(listed[1]["id"], 2);
        volume(&endpoint, &["rm", "p/b"]).unwrap();
        assert!(!volume(&endpoint, &["ls", "p"]).unwrap().contains("b\t"));
        let missing = volume(&endpoint, &["rm", "p/b"]).unwrap_err();
        assert!(missing.to_string().contains("does not exist"), "{missing}");
    }
}
