//! Kubernetes resource quantities (`500m`, `64Gi`, `1.5`, `1e3`) as integers.

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad quantity {0:?}")]
pub(crate) struct BadQuantity(pub String);

/// The quantity times `scale` (1000 for millis), rounded up as Kubernetes does.
pub(crate) fn parse_scaled(text: &str, scale: u32) -> Result<i64, BadQuantity> {
    let bad = || BadQuantity(text.to_owned());
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(t.len());
    let (number, suffix) = t.split_at(split);
    if number.is_empty() {
        return Err(bad());
    }
    let (mantissa_exp, multiplier): (i32, f64) = match suffix {
        "" => (0, 1.0),
        "n" => (-9, 1.0),
        "u" => (-6, 1.0),
        "m" => (-3, 1.0),
        "k" => (3, 1.0),
        "M" => (6, 1.0),
        "G" => (9, 1.0),
        "T" => (12, 1.0),
        "P" => (15, 1.0),
        "E" => (18, 1.0),
        "Ki" => (0, 1024.0),
        "Mi" => (0, 1024f64.powi(2)),
        "Gi" => (0, 1024f64.powi(3)),
        "Ti" => (0, 1024f64.powi(4)),
        "Pi" => (0, 1024f64.powi(5)),
        "Ei" => (0, 1024f64.powi(6)),
        s if s.starts_with(['e', 'E']) => (s[1..].parse().map_err(|_| bad())?, 1.0),
        _ => return Err(bad()),
    };
    let n: f64 = number.parse().map_err(|_| bad())?;
    let value = n * multiplier * 10f64.powi(mantissa_exp) * f64::from(scale);
    if !value.is_finite() || value < 0.0 {
        return Err(bad());
    }
    // Ceil, with a little slack so that 0.1 * 1000 does not become 101.
    let rounded = (value - 1e-6).ceil().max(0.0);
    if rounded > i64::MAX as f64 {
        return Ok(i64::MAX);
    }
    Ok(rounded as i64)
}

#[cfg(test)]
pub(crate) fn parse(text: &str) -> Result<i64, BadQuantity> {
    parse_scaled(text, 1)
}

pub(crate) fn parse_milli(text: &str) -> Result<i64, BadQuantity> {
    parse_scaled(text, 1000)
}

/// The quantity as a whole number, as Go's `Quantity.AsInt64` reads it: `16` is 16, `64Gi`
/// is its bytes, and `3500m` or `1.5` are not whole numbers (an error).
pub(crate) fn parse_whole(text: &str) -> Result<i64, BadQuantity> {
    let milli = parse_milli(text)?;
    if milli == i64::MAX || milli % 1000 != 0 {
        return Err(BadQuantity(text.to_owned()));
    }
    Ok(milli / 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(parse_milli("4").unwrap(), 4000);
        assert_eq!(parse_milli("500m").unwrap(), 500);
        assert_eq!(parse_milli("0.1").unwrap(), 100);
        assert_eq!(parse_milli("1.5").unwrap(), 1500);
        assert_eq!(parse("64Gi").unwrap(), 64 << 30);
        assert_eq!(parse("128974848").unwrap(), 128_974_848);
        assert_eq!(parse("129e6").unwrap(), 129_000_000);
        assert_eq!(parse("123Mi").unwrap(), 123 << 20);
        assert_eq!(parse("1k").unwrap(), 1000);
        assert_eq!(parse("110").unwrap(), 110);
        assert_eq!(parse("100m").unwrap(), 1);
        assert_eq!(parse_whole("16").unwrap(), 16);
        assert_eq!(parse_whole("64Gi").unwrap(), 64 << 30);
        assert_eq!(parse_whole("4000m").unwrap(), 4);
        assert!(parse_whole("3500m").is_err());
        assert!(parse_whole("1.5").is_err());
        for bad in ["", "Gi", "12X", "-5", "1e", "abc"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
