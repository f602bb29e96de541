//! One line per event on standard error (the format of every long-running
//! ecdedup cluster process's log): `key=value` pairs by default, one JSON
//! object per line with `ECDEDUP_LOG=json` in the environment.

use std::fmt::Display;

/// Logs `event` about the connection with `peer`; `reason` is quoted.
pub(crate) fn event(event: &str, peer: &dyn Display, reason: &dyn Display) {
    line(
        "ecdedup-transport",
        event,
        &[("peer", peer), ("reason", reason)],
    );
}

/// Whether lines are JSON (`ECDEDUP_LOG=json`), read once.
fn json() -> bool {
    static JSON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *JSON.get_or_init(|| std::env::var("ECDEDUP_LOG").is_ok_and(|v| v == "json"))
}

/// Formats one event of `component` with its fields.
pub fn format_line(
    json: bool,
    component: &str,
    event: &str,
    fields: &[(&str, &dyn Display)],
) -> String {
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    if json {
        let ts = format!("{ts:.3}");
        let head: [(&str, &dyn Display); 3] =
            [("ts", &ts), ("component", &component), ("event", &event)];
        let parts: Vec<String> = head
            .iter()
            .chain(fields)
            .map(|(k, v)| format!("{}:{}", json_string(k), json_string(&v.to_string())))
            .collect();
        format!("{{{}}}", parts.join(","))
    } else {
        let mut s = format!("ts={ts:.3} component={component} event={event}");
        for (k, v) in fields {
            let v = v.to_string();
            if v.is_empty() || v.contains([' ', '"', '=']) {
                s.push_str(&format!(" {k}=\"{}\"", v.replace('"', "'")));
            } else {
                s.push_str(&format!(" {k}={v}"));
            }
        }
        s
    }
}

/// A JSON string literal.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Logs one event of `component` with its fields, on standard error.
pub fn line(component: &str, event: &str, fields: &[(&str, &dyn Display)]) {
    eprintln!("{}", format_line(json(), component, event, fields));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_key_value_or_json() {
        let kv = format_line(
            false,
            "c",
            "started",
            &[("addr", &"127.0.0.1:1"), ("why", &"a b")],
        );
        assert!(
            kv.contains("component=c event=started addr=127.0.0.1:1 why=\"a b\""),
            "{kv}"
        );
        let js = format_line(true, "c", "started", &[("why", &"say \"hi\"")]);
        assert!(js.starts_with("{\"ts\":"), "{js}");
        assert!(js.ends_with(",\"why\":\"say \\\"hi\\\"\"}"), "{js}");
    }
}
