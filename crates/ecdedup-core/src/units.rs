//! Parsing and printing byte sizes ("32K", "8G", "1MiB").

use crate::error::{Error, Result};

/// Parses a size with an optional binary suffix: K, M, G, T (also KiB, MiB...).
pub fn parse_size(text: &str) -> Result<u64> {
    let t = text.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(digits_end);
    if num.is_empty() {
        return Err(Error::Config(format!(
            "size {text:?} does not start with a number"
        )));
    }
    let n: u64 = num
        .parse()
        .map_err(|_| Error::Config(format!("size {text:?} is too large")))?;
    let shift = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" | "kb" => 10,
        "m" | "mib" | "mb" => 20,
        "g" | "gib" | "gb" => 30,
        "t" | "tib" | "tb" => 40,
        other => {
            return Err(Error::Config(format!(
                "size {text:?} has unknown suffix {other:?}"
            )))
        }
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| Error::Config(format!("size {text:?} is too large")))
}

/// Formats bytes with the largest binary unit that divides them.
pub fn format_size(bytes: u64) -> String {
    for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if bytes >= (1 << shift) && bytes.is_multiple_of(1 << shift) {
            return format!("{}{}", bytes >> shift, unit);
        }
    }
    format!("{bytes}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_size("32K").unwrap(), 32 << 10);
        assert_eq!(parse_size("8G").unwrap(), 8 << 30);
        assert_eq!(parse_size("1MiB").unwrap(), 1 << 20);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("K").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("99999999999999999999").is_err());
        assert_eq!(format_size(32 << 10), "32K");
    }
}
