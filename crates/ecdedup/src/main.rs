fn main() {
    // A closed stdout (`ecdedup status | head -1`) ends the command the way
    // it ends `cat`: by SIGPIPE, quietly. Rust ignores SIGPIPE by default,
    // which turns a closed pipe into a panic in `println!`. Sockets this
    // process writes to are written with MSG_NOSIGNAL
    // (`control::SocketWriter`), so a peer that went away stays an error
    // value there. `serve` execs nbdkit, which ignores SIGPIPE itself; the
    // commands that talk to etcd ignore it too (`cluster_cli::ignore_sigpipe`).
    // SAFETY: signal(2) before any thread is started.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    ecdedup::cli::install_panic_hook();
    std::process::exit(ecdedup::cli::main());
}
