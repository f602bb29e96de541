//! The control socket: how the CLI talks to a running server.
//!
//! A server listens on `DIR/control.sock` (a Unix socket, mode 0600); each
//! connection carries one JSON request line and gets one JSON response line.
//! Long operations (rebuild, scrub) start in a thread of the server and are
//! followed through `Status`. The listener is bounded: one connection is
//! served at a time, with a read timeout, and a request line is at most
//! [`REQUEST_BYTES_MAX`] bytes.

use crate::array::{Array, ScrubReport, Status};
use crate::counters::Stats;
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub const SOCKET_FILE: &str = "control.sock";
const REQUEST_BYTES_MAX: u64 = 64 << 10;
const IO_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "snake_case")]
pub enum Request {
    Status,
    Stats,
    Flush,
    Fail {
        position: usize,
    },
    Replace {
        position: usize,
        path: Option<PathBuf>,
    },
    Rebuild,
    Scrub {
        repair: bool,
    },
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "response", rename_all = "snake_case")]
pub enum Response {
    Ok,
    Status(Box<Status>),
    Stats(Box<Stats>),
    /// The operation began after the one numbered `after_seq`.
    Started {
        operation: String,
        after_seq: u64,
    },
    Error {
        message: String,
    },
}

pub fn socket_path(dir: &Path) -> PathBuf {
    dir.join(SOCKET_FILE)
}

/// Starts the listener thread; replaces a stale socket file.
pub fn serve(array: Arc<Array>) -> Result<()> {
    let path = socket_path(array.dir());
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)
        .map_err(|e| Error::io(format!("binding {}", path.display()), e))?;
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600));
    std::thread::Builder::new()
        .name("ecdedup-control".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                if let Err(e) = handle(&array, conn) {
                    eprintln!("ecdedup: control connection: {e}");
                }
            }
        })
        .map_err(|e| Error::io("starting the control thread", e))?;
    Ok(())
}

fn handle(array: &Arc<Array>, conn: UnixStream) -> std::io::Result<()> {
    conn.set_read_timeout(Some(IO_TIMEOUT))?;
    conn.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut line = String::new();
    BufReader::new((&conn).take(REQUEST_BYTES_MAX)).read_line(&mut line)?;
    let response = match serde_json::from_str::<Request>(&line) {
        Ok(req) => execute(array, req),
        Err(e) => Response::Error {
            message: format!("malformed request: {e}"),
        },
    };
    let mut out = serde_json::to_string(&response).expect("response serialises");
    out.push('\n');
    (&conn).write_all(out.as_bytes())
}

fn result_to_response(r: Result<()>) -> Response {
    match r {
        Ok(()) => Response::Ok,
        Err(e) => Response::Error {
            message: e.to_string(),
        },
    }
}

fn execute(array: &Arc<Array>, req: Request) -> Response {
    match req {
        Request::Status => Response::Status(Box::new(array.status())),
        Request::Stats => Response::Stats(Box::new(array.stats())),
        Request::Flush => result_to_response(array.flush()),
        Request::Fail { position } => result_to_response(array.fail_device(position)),
        Request::Replace { position, path } => {
            result_to_response(array.replace_device(position, path.as_deref()))
        }
        Request::Rebuild => start(array, "rebuild", |a| a.rebuild(None).map(|_| ())),
        Request::Scrub { repair } => start(array, "scrub", move |a| {
            a.scrub(repair, None).map(|r: ScrubReport| {
                eprintln!(
                    "ecdedup: scrub finished: {}",
                    serde_json::to_string(&r).unwrap_or_default()
                );
            })
        }),
    }
}

fn start(
    array: &Arc<Array>,
    name: &str,
    op: impl FnOnce(&Array) -> Result<()> + Send + 'static,
) -> Response {
    if let Some(p) = array.operation() {
        if !p.finished {
            return Response::Error {
                message: format!("{} is already running ({} of {})", p.op, p.done, p.total),
            };
        }
    }
    let after_seq = array.operation().map_or(0, |p| p.seq);
    let a = Arc::clone(array);
    let spawned = std::thread::Builder::new()
        .name(format!("ecdedup-{name}"))
        .spawn(move || {
            if let Err(e) = op(&a) {
                eprintln!("ecdedup: {e}");
            }
        });
    match spawned {
        Ok(_) => Response::Started {
            operation: name.into(),
            after_seq,
        },
        Err(e) => Response::Error {
            message: format!("cannot start {name}: {e}"),
        },
    }
}

/// Sends one request to the server of `dir`.
pub fn request(dir: &Path, req: &Request) -> Result<Response> {
    let path = socket_path(dir);
    let conn = UnixStream::connect(&path).map_err(|e| {
        Error::Unavailable(format!(
            "the array is in use but its server does not answer on {}: {e}",
            path.display()
        ))
    })?;
    conn.set_read_timeout(Some(IO_TIMEOUT)).ok();
    let mut line = serde_json::to_string(req).expect("request serialises");
    line.push('\n');
    SocketWriter(&conn)
        .write_all(line.as_bytes())
        .map_err(|e| Error::io("sending to the server", e))?;
    let mut answer = String::new();
    BufReader::new(&conn)
        .read_line(&mut answer)
        .map_err(|e| Error::io("reading the server's answer", e))?;
    let resp: Response = serde_json::from_str(&answer)
        .map_err(|e| Error::Other(format!("malformed answer from server: {e}")))?;
    if let Response::Error { message } = resp {
        return Err(Error::Other(message));
    }
    Ok(resp)
}

/// Writes to a socket with MSG_NOSIGNAL: a peer that went away is an
/// `EPIPE` error, never a SIGPIPE (the CLI lets SIGPIPE end it, for a
/// closed stdout; see `main.rs`).
pub struct SocketWriter<'a>(pub &'a UnixStream);

impl Write for SocketWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        use std::os::fd::AsRawFd;
        loop {
            // SAFETY: send(2) on an open socket, from a live buffer.
            let n = unsafe {
                libc::send(
                    self.0.as_raw_fd(),
                    buf.as_ptr().cast(),
                    buf.len(),
                    libc::MSG_NOSIGNAL,
                )
            };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Serves Prometheus text at `GET /metrics` on `addr` (one request per
/// connection, request head bounded to 8 KiB, 10 s timeouts).
pub fn serve_metrics(array: Arc<Array>, addr: &str) -> Result<()> {
    use std::net::TcpListener;
    // A bare port binds loopback only.
    let addr = if addr.contains(':') {
        addr.to_string()
    } else {
        format!("127.0.0.1:{addr}")
    };
    let addr = addr.as_str();
    let listener = TcpListener::bind(addr)
        .map_err(|e| Error::io(format!("binding metrics address {addr}"), e))?;
    std::thread::Builder::new()
        .name("ecdedup-metrics".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
                let _ = conn.set_write_timeout(Some(Duration::from_secs(10)));
                let mut head = String::new();
                let mut reader = BufReader::new((&conn).take(8 << 10));
                let _ = reader.read_line(&mut head);
                loop {
                    let mut line = String::new();
                    match reader.read_line(&mut line) {
                        Ok(0) | Err(_) => break,
                        Ok(_) if line == "\r\n" || line == "\n" => break,
                        Ok(_) => {}
                    }
                }
                let (status, body) = if head.starts_with("GET /metrics ") || head.starts_with("GET / ") {
                    ("200 OK", array.stats().prometheus())
                } else {
                    ("404 Not Found", "try GET /metrics\n".to_string())
                };
                let _ = write!(
                    conn,
                    "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        })
        .map_err(|e| Error::io("starting the metrics thread", e))?;
    Ok(())
}
