//! Byte sizes on the command line: `24MiB`, `8GiB`, `512MB`, `1.5GiB`, `100B`, `0`.
//!
//! Units are case-insensitive: `B`; decimal `KB`, `MB`, `GB`, `TB`; binary `KiB`, `MiB`, `GiB`,
//! `TiB` (also written `K`, `M`, `G`, `T`). A number without a unit is refused (PowerInfer's
//! `--vram-budget` counts GiB, llama.cpp's sizes count bytes), except `0`.

/// Parses a size into bytes (rounded down), or says what is wrong with it.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let s = text.trim();
    if s.starts_with('-') {
        return Err(format!("{text:?}: a size cannot be negative"));
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = (&s[..split], s[split..].trim());
    if number.is_empty() {
        return Err(format!(
            "{text:?}: expected a number followed by a unit, like 8GiB or 512MB"
        ));
    }
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?}: {number:?} is not a number"))?;
    let multiplier: f64 = match unit.to_ascii_lowercase().as_str() {
        "" if value == 0.0 => 1.0,
        "" => {
            return Err(format!(
                "{text:?}: missing unit (write e.g. {number}GiB, {number}MB or {number}B)"
            ))
        }
        "b" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => {
            return Err(format!(
                "{text:?}: unknown unit {unit:?} (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)"
            ))
        }
    };
    let bytes = value * multiplier;
    if bytes >= u64::MAX as f64 {
        return Err(format!("{text:?}: too large"));
    }
    Ok(bytes as u64)
}

/// `bytes` in the largest binary unit that keeps it at least 1, with two decimals.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.2} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_size("24MiB"), Ok(24 << 20));
        assert_eq!(parse_size("8GiB"), Ok(8 << 30));
        assert_eq!(parse_size("8gib"), Ok(8 << 30));
        assert_eq!(parse_size("512MB"), Ok(512_000_000));
        assert_eq!(parse_size("1.5 GiB"), Ok(3 << 29));
        assert_eq!(parse_size("100B"), Ok(100));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("0GiB"), Ok(0));
    }

    #[test]
    fn refuses_bad_sizes_clearly() {
        for (bad, why) in [
            ("12", "missing unit"),
            ("12XB", "unknown unit"),
            ("-1GiB", "negative"),
            ("GiB", "expected a number"),
            ("", "expected a number"),
            ("1.2.3GB", "not a number"),
            ("99999999999TiB", "too large"),
        ] {
            let e = parse_size(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn formats_sizes() {
        assert_eq!(format_size(0), "0 B");
        assert_eq!(format_size(1023), "1023 B");
        assert_eq!(format_size(24 << 20), "24.00 MiB");
        assert_eq!(format_size(3 << 29), "1.50 GiB");
    }
}
