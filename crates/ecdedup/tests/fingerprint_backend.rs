//! Choosing the fingerprint backend from the command line: `create
//! --fingerprint-backend cpu|gpu|auto` records the choice in the array's
//! config, `serve --fingerprint-backend` overrides it for one run, and
//! `status` and the server's log say which backend runs and why.
//!
//! These tests are written for CI machines without a GPU (the usual case):
//! there `auto` must pick the CPU and say so, and `gpu` must fail at open
//! with a clear error and a non-zero exit, never a panic. On a machine with a
//! usable GPU the `auto` test checks that it picked the GPU instead, and the
//! `gpu`-without-a-GPU tests say loudly that they have nothing to check.

use crate::support;

use support::*;

/// RS(4,2) with the dedup layer on every block (SHA-1, the paper's) and the
/// given backend, in a fresh folder.
fn dedup_array(backend: &str) -> TestArray {
    let mut args = create_args("64M");
    args.extend(
        [
            "--dedup",
            "all",
            "--fingerprint",
            "sha1",
            "--fingerprint-backend",
            backend,
        ]
        .map(String::from),
    );
    TestArray::create_with(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// Whether this machine has an NVIDIA driver at all: without one no GPU
/// backend can run. (With one, the tests that need its absence skip loudly.)
fn nvidia_driver_present() -> bool {
    ["/proc/driver/nvidia/version", "/dev/nvidiactl"]
        .iter()
        .any(|p| std::path::Path::new(p).exists())
}

fn assert_no_panic(out: &Out) {
    for text in [&out.stdout, &out.stderr] {
        assert!(
            !text.contains("panicked") && !text.contains("RUST_BACKTRACE"),
            "a panic instead of an error value: {out}"
        );
    }
}

#[test]
fn auto_picks_the_cpu_without_a_gpu_and_status_says_why() {
    let a = dedup_array("auto");
    let config = std::fs::read_to_string(a.dir.join("array.json")).expect("array.json");
    assert!(
        config.contains("\"fingerprint_backend\": \"auto\""),
        "create did not record the choice: {config}"
    );

    let status = a.cli(&["status"]).ok();
    let line = status
        .stdout
        .lines()
        .find(|l| l.starts_with("fingerprint backend: "))
        .unwrap_or_else(|| panic!("status names no fingerprint backend: {status}"))
        .to_string();
    eprintln!("status says: {line}");
    let json = a.status();
    let why = json["fingerprint_backend"]
        .as_str()
        .expect("status --json names the backend");
    assert!(line.ends_with(why), "{line} vs {why}");
    assert!(why.starts_with("auto: "), "{why}");
    if why.contains("using gpu") {
        eprintln!("!!! a usable GPU is present: auto picked it ({why})");
        assert!(
            nvidia_driver_present(),
            "auto picked a GPU with no NVIDIA driver: {why}"
        );
    } else {
        assert!(
            why.contains("no usable GPU")
                && why.contains("using cpu (")
                && why.contains(" threads)"),
            "auto should say it found no GPU and uses the CPU: {why}"
        );
    }
}

#[test]
fn serve_logs_the_backend_and_overrides_the_configured_one() {
    let a = dedup_array("cpu");
    let server = a
        .try_serve(&["--fingerprint-backend", "auto"])
        .unwrap_or_else(|e| panic!("{e}"));
    let status = a.status();
    let why = status["fingerprint_backend"]
        .as_str()
        .expect("backend")
        .to_string();
    let log = server.log_text();
    server.stop();
    assert!(
        why.starts_with("auto: "),
        "the override did not apply: {why}"
    );
    assert!(
        log.contains(&format!("ecdedup: fingerprint backend: {why}")),
        "the server log does not say which backend runs ({why}):\n{log}"
    );
    // Without the override the configured choice is back.
    assert!(
        a.status()["fingerprint_backend"]
            .as_str()
            .expect("backend")
            .starts_with("cpu: chosen by configuration ("),
        "{}",
        a.status()
    );
}

#[test]
fn offline_commands_hash_on_the_cpu_when_the_configured_gpu_is_absent() {
    if nvidia_driver_present() {
        eprintln!(
            "!!! SKIPPED: an NVIDIA driver is present; this test needs a machine without a GPU"
        );
        return;
    }
    // Creating is fine: the array may be meant for a GPU machine; offline
    // maintenance must still work here (serve is what insists on the GPU,
    // see the next test).
    let a = dedup_array("gpu");
    let out = a.cli(&["status"]).ok();
    assert_no_panic(&out);
    assert!(
        out.stdout.contains("cpu"),
        "offline status should say it hashes on the cpu: {out}"
    );
    a.cli(&["scrub"]).ok();
}

#[test]
fn serve_with_gpu_and_no_gpu_exits_non_zero_with_a_clear_error() {
    if nvidia_driver_present() {
        eprintln!(
            "!!! SKIPPED: an NVIDIA driver is present; this test needs a machine without a GPU"
        );
        return;
    }
    let a = dedup_array("cpu");
    let err = match a.try_serve(&["--fingerprint-backend", "gpu"]) {
        Ok(server) => {
            server.stop();
            panic!("serve --fingerprint-backend gpu started without a GPU");
        }
        Err(e) => e,
    };
    assert!(
        err.contains("exited (exit status: 1)")
            && err.contains("gpu backend chosen by configuration cannot run")
            && err.contains("no CUDA device"),
        "serve should exit 1 saying why the GPU backend cannot run: {err}"
    );
    assert!(
        !err.contains("panicked"),
        "a panic instead of an error: {err}"
    );
    // The array itself is untouched and still serves with its own backend.
    a.serve().stop();
}

#[test]
fn an_unknown_backend_name_is_refused_with_the_choices() {
    let a = TestArray::empty();
    let mut args = create_args("64M");
    args.extend(["--dedup", "all", "--fingerprint-backend", "tpu"].map(String::from));
    let out = a
        .cli(&args.iter().map(String::as_str).collect::<Vec<_>>())
        .failed();
    assert_no_panic(&out);
    assert!(
        out.stderr.contains("--fingerprint-backend") && out.stderr.contains("cpu, gpu or auto"),
        "{out}"
    );
    assert!(
        !a.dir.join("array.json").exists(),
        "a refused create left an array behind"
    );
}
