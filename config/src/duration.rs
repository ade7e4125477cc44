//! Go-style durations, as the kubelet's `metav1.Duration` fields are written: `1m30s`, `300ms`, `5m0s`, `1.5h`.

use std::time::Duration;

/// Parses a Go duration. Negative durations are refused: no kubelet field nodewarden reads allows one.
pub fn parse(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let bad = || format!("{s:?} is not a duration (examples: 10s, 1m30s, 300ms, 5m)");
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    if t.starts_with('-') {
        return Err(format!("{s:?} is negative"));
    }
    let mut rest = t.strip_prefix('+').unwrap_or(t);
    if rest.is_empty() {
        return Err(bad());
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(bad)?;
        let (num, tail) = rest.split_at(num_end);
        let value: f64 = num.parse().map_err(|_| bad())?;
        let unit_end = tail.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_end);
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += value * scale;
        rest = tail;
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        let cases = [
            ("10s", 10_000),
            ("1m30s", 90_000),
            ("300ms", 300),
            ("5m0s", 300_000),
            ("1.5h", 5_400_000),
            ("0", 0),
            ("2h45m", 9_900_000),
        ];
        for (s, ms) in cases {
            assert_eq!(parse(s), Ok(Duration::from_millis(ms)), "{s}");
        }
        for bad in ["", "10", "1x", "-5s", "s", "1.2.3s", "5 m"] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}
