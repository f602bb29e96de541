//! One line per event on standard error, as `key=value` pairs (the format
//! of every long-running ecdedup process's log).

use std::fmt::Display;

/// Logs `event` about the connection with `peer`; `reason` is quoted.
pub(crate) fn event(event: &str, peer: &dyn Display, reason: &dyn Display) {
    let reason = reason.to_string().replace('"', "'");
    eprintln!("ecdedup-transport: event={event} peer={peer} reason=\"{reason}\"");
}
