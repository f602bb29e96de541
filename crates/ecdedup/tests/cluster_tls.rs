//! etcd over TLS with client certificates, as docs/cluster.md's
//! multi-host deployment runs it: a CA, etcd's certificate and a client
//! certificate made with `openssl`, Debian's etcd started with
//! `--client-cert-auth` on loopback, and the commands given
//! `--etcd-ca/--etcd-cert/--etcd-key`: chunk servers register, a pool and
//! a volume are made and listed, and `serve --cluster` serves the volume
//! (its nbdkit plugin reaching etcd with the same files). Without the client certificate, without
//! a CA, or with a file that is not PEM, a command fails in bounded time
//! with an error that says why. `cluster up --etcd-tls` makes its own
//! certificates (in process) and its commands need no TLS option.

use crate::support;

use ecdedup_cluster::{Etcd, EtcdConfig, EtcdTls, LocalEtcd, ServerTls};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use support::*;

/// A command refused by etcd or by its own checks ends well within this.
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs `openssl` in `dir` with `args` (split at spaces: no value holds
/// one).
fn openssl(dir: &Path, args: &str) {
    run_ok(
        Command::new("openssl")
            .current_dir(dir)
            .args(args.split(' ')),
        CLI_TIMEOUT,
    );
}

/// openssl's arguments for a new P-256 key in `key`.
fn new_key(key: &str) -> String {
    format!("-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout {key}")
}

/// A P-256 key and a certificate for `name` signed by the CA in `dir`
/// (`ca.pem`, `ca.key`), with `san` as its subjectAltName.
fn signed(dir: &Path, name: &str, san: &str) {
    std::fs::write(
        dir.join(format!("{name}.ext")),
        format!("subjectAltName={san}\n"),
    )
    .unwrap();
    let key = new_key(&format!("{name}.key"));
    openssl(dir, &format!("req {key} -out {name}.csr -subj /CN={name}"));
    openssl(
        dir,
        &format!(
            "x509 -req -in {name}.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
             -extfile {name}.ext -out {name}.pem"
        ),
    );
}

/// A CA, etcd's certificate (for 127.0.0.1) and a client certificate.
fn certificates(dir: &Path) {
    let key = new_key("ca.key");
    openssl(
        dir,
        &format!("req -x509 {key} -out ca.pem -days 2 -subj /CN=ecdedup-test-CA"),
    );
    signed(dir, "etcd", "IP:127.0.0.1");
    signed(dir, "client", "DNS:ecdedup-client");
}

fn tls_args(dir: &Path, with_cert: bool) -> Vec<String> {
    let path = |f: &str| dir.join(f).display().to_string();
    let mut args = vec!["--etcd-ca".into(), path("ca.pem")];
    if with_cert {
        args.extend(["--etcd-cert".into(), path("client.pem")]);
        args.extend(["--etcd-key".into(), path("client.key")]);
    }
    args
}

fn ecdedup(args: &[String], timeout: Duration) -> Out {
    let started = Instant::now();
    let out = run(Command::new(ecdedup_bin()).args(args), timeout);
    eprintln!("ecdedup {args:?}: {:?}", started.elapsed());
    out
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

/// `ecdedup ARGS` must fail, saying `why` on stderr.
fn assert_refused(args: &[&str], why: &str) {
    let out = ecdedup(&strings(args), REFUSAL_TIMEOUT);
    assert!(
        !out.success() && out.stderr.contains(why),
        "not refused with {why:?}: {out}"
    );
}

#[test]
fn commands_and_chunk_servers_reach_etcd_over_tls_only_with_a_client_certificate() {
    require_tool("etcd");
    require_tool("openssl");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    certificates(dir);
    let etcd = LocalEtcd::start_tls(
        &dir.join("etcd"),
        &ServerTls {
            cert: dir.join("etcd.pem"),
            key: dir.join("etcd.key"),
            client_ca: dir.join("ca.pem"),
            peer: None,
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let endpoint = etcd.endpoint();
    assert!(endpoint.starts_with("https://"), "{endpoint}");
    let etcd_args = |with_cert: bool| -> Vec<String> {
        let mut a = strings(&["--etcd", &endpoint, "--cluster", "tls"]);
        a.extend(tls_args(dir, with_cert));
        a
    };

    // Two chunk servers register over TLS.
    let key = dir.join("cluster.key");
    ecdedup_transport::ClusterKey::generate()
        .write_new(&key)
        .unwrap();
    let _servers: Vec<Background> = (1..=2)
        .map(|id| {
            let data = dir.join(format!("server{id}"));
            std::fs::create_dir_all(&data).unwrap();
            let mut args = strings(&["chunkd"]);
            args.extend(etcd_args(true));
            args.extend(strings(&[
                "--id",
                &id.to_string(),
                "--listen",
                "127.0.0.1:0",
                "--host",
                &format!("host{id}"),
                "--key",
                key.to_str().unwrap(),
                "--data",
                data.to_str().unwrap(),
                "--io",
                "buffered",
            ]));
            Background::spawn(Command::new(ecdedup_bin()).args(&args))
        })
        .collect();
    let config = EtcdConfig::new(vec![endpoint.clone()], "tls").with_tls(EtcdTls {
        ca: Some(dir.join("ca.pem")),
        cert: Some(dir.join("client.pem")),
        key: Some(dir.join("client.key")),
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let etcd = Etcd::connect(config).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let live = ecdedup_cluster::list_servers(&etcd).await.unwrap();
            if live.len() == 2 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the chunk servers did not register over TLS within 120 s ({} did)",
                live.len()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });

    // A pool and a volume, made and listed with the client certificate.
    let mut create_pool = strings(&["pool"]);
    create_pool.extend(etcd_args(true));
    create_pool.extend(strings(&[
        "create",
        "p",
        "--policy",
        "replicate",
        "--copies",
        "2",
        "--pgs",
        "1",
        "--failure-domain",
        "device",
    ]));
    ecdedup(&create_pool, CLI_TIMEOUT).ok();
    let volume = |with_cert: bool, command: &[&str]| {
        let mut a = strings(&["volume"]);
        a.extend(etcd_args(with_cert));
        a.extend(strings(command));
        ecdedup(&a, REFUSAL_TIMEOUT)
    };
    volume(true, &["create", "p/v", "--size", "1G"]).ok();
    let listed = volume(true, &["ls", "p"]).ok();
    assert!(listed.stdout.contains("v\tid 1"), "{listed}");

    // `serve --cluster` hands the TLS files to its nbdkit plugin, which
    // takes the volume over and serves it.
    let mut serve = strings(&[
        "--cluster",
        &endpoint,
        "--cluster-name",
        "tls",
        "--volume",
        "p/v",
        "--key",
        key.to_str().unwrap(),
    ]);
    serve.extend(tls_args(dir, true));
    let serve: Vec<&str> = serve.iter().map(String::as_str).collect();
    let server = Server::start(
        &dir.join("serve"),
        &dir.join("serve.sock"),
        &dir.join("serve.log"),
        &serve,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let size = run_ok(
        Command::new("nbdinfo").arg("--size").arg(server.uri()),
        CLI_TIMEOUT,
    );
    assert_eq!(size.stdout.trim(), (1u64 << 30).to_string(), "{size}");
    server.stop();

    // Without the client certificate, etcd refuses the connection.
    let refused = volume(false, &["ls", "p"]);
    assert!(!refused.success(), "{refused}");
    assert!(
        refused.stderr.contains("no client certificate was given"),
        "{refused}"
    );

    // https:// without a CA, and a key file that is no PEM key, are
    // refused before any connection, naming the option or the file.
    assert_refused(&["volume", "--etcd", &endpoint, "ls", "p"], "--etcd-ca");
    let mut bad_key = strings(&["volume", "--etcd", &endpoint]);
    let ca: PathBuf = dir.join("ca.pem");
    bad_key.extend(strings(&[
        "--etcd-ca",
        ca.to_str().unwrap(),
        "--etcd-cert",
        dir.join("client.pem").to_str().unwrap(),
        "--etcd-key",
        ca.to_str().unwrap(),
        "ls",
        "p",
    ]));
    let bad_key = ecdedup(&bad_key, REFUSAL_TIMEOUT);
    assert!(
        !bad_key.success()
            && bad_key.stderr.contains(ca.to_str().unwrap())
            && bad_key.stderr.contains("no PEM private key"),
        "{bad_key}"
    );
}

/// `cluster down` of a test's cluster in every path.
struct Down(PathBuf);

impl Drop for Down {
    fn drop(&mut self) {
        if self.0.join("cluster.json").exists() {
            let _ = run(
                Command::new(ecdedup_bin())
                    .arg("--dir")
                    .arg(&self.0)
                    .args(["cluster", "down"]),
                CLI_TIMEOUT,
            );
        }
    }
}

/// `cluster up --etcd-tls`: etcd on https with `--client-cert-auth`, the
/// certificates made in the cluster's folder (private keys 0600), the
/// chunk servers and `cluster status` reaching etcd through the files
/// the cluster recorded, with no TLS option given; a plain-HTTP client
/// and an https client without the client certificate are refused; the
/// peer port takes TLS with the peer certificate only.
#[test]
fn cluster_up_with_etcd_tls_serves_its_commands_and_refuses_plain_http() {
    use std::os::unix::fs::PermissionsExt;
    require_tool("etcd");
    require_tool("openssl");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("c");
    let _down = Down(dir.clone());
    let cli = |args: &[&str]| {
        ecdedup(
            &[&["--dir", dir.to_str().unwrap()][..], args]
                .concat()
                .iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>(),
            REFUSAL_TIMEOUT,
        )
    };
    let up = cli(&[
        "cluster",
        "up",
        "--etcd-tls",
        "--servers",
        "2",
        "--policy",
        "replicate",
        "--copies",
        "2",
        "--pgs",
        "1",
        "--size",
        "64M",
        "--no-serve",
    ])
    .ok();
    let endpoint = printed_etcd(&up);
    assert!(endpoint.starts_with("https://127.0.0.1:"), "{up}");
    for key in ["etcd.key", "etcd-peer.key", "client.key"] {
        let mode = std::fs::metadata(dir.join("tls").join(key))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "tls/{key}");
    }
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("cluster.json")).unwrap()).unwrap();
    let etcd_cmdline =
        std::fs::read(format!("/proc/{}/cmdline", state["etcd_pid"])).unwrap_or_default();
    let etcd_cmdline = String::from_utf8_lossy(&etcd_cmdline).replace('\0', " ");
    assert!(
        etcd_cmdline.contains("--client-cert-auth"),
        "etcd runs without --client-cert-auth: {state}"
    );
    // Its peer port takes TLS, and only the peer certificate's name: the
    // clients' certificate, of the same CA, cannot talk Raft to it.
    let peer_port = etcd_cmdline
        .split_whitespace()
        .find_map(|a| a.strip_prefix("--listen-peer-urls=https://127.0.0.1:"))
        .unwrap_or_else(|| panic!("etcd's peer port is not https: {etcd_cmdline}"));
    let tls_dir = dir.join("tls");
    let version_over_tls = |cert: &str| {
        let out = Command::new("timeout")
            .arg("60")
            .arg("sh")
            .arg("-c")
            .arg(format!(
                "printf 'GET /version HTTP/1.0\\r\\n\\r\\n' | openssl s_client -quiet \
                 -ign_eof -connect 127.0.0.1:{peer_port} -CAfile ca.pem -cert {cert}.pem \
                 -key {cert}.key"
            ))
            .current_dir(&tls_dir)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(
        version_over_tls("etcd-peer").contains("etcdserver"),
        "a member's peer certificate is refused on the peer port"
    );
    let as_client = version_over_tls("client");
    assert!(
        !as_client.contains("etcdserver"),
        "the peer port answered a client's certificate: {as_client}"
    );

    // No TLS option: `cluster status` takes the files from cluster.json.
    let status = cli(&["cluster", "status", "--json"]).ok();
    let status: serde_json::Value = serde_json::from_str(&status.stdout).unwrap();
    let states: Vec<&str> = status["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["up", "up"], "{status}");
    assert_eq!(status["pools"][0]["volumes"][0]["name"], "vol0", "{status}");

    // Plain HTTP to etcd's port, and https without a client certificate:
    // refused.
    let plain = endpoint.replace("https://", "http://");
    assert_refused(&["volume", "--etcd", &plain, "ls", "pool0"], "no endpoint");
    let ca = dir.join("tls").join("ca.pem");
    assert_refused(
        &[
            "volume",
            "--etcd",
            &endpoint,
            "--etcd-ca",
            ca.to_str().unwrap(),
            "ls",
            "pool0",
        ],
        "no client certificate was given",
    );
    cli(&["cluster", "down"]).ok();
}
