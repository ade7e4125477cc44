//! Kubernetes resource quantities (`100Mi`, `1.5Gi`, `500m`, `2e3`, `1k`) with exact arithmetic, and the
//! quantity-or-percentage amounts that eviction thresholds use.
//!
//! As in apimachinery, converting a quantity to an integer rounds up: `value("1.5")` is 2 and
//! `milli_value("0.0001")` is 1.

use std::fmt;

/// Why a quantity was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// Not of the quantity grammar.
    #[error("{0:?} is not a quantity (expected a number with an optional suffix such as Ki, Mi, Gi, m, k, M, G)")]
    Syntax(String),
    /// Too large to be represented.
    #[error("{0:?} is too large")]
    Overflow(String),
    /// Negative where only non-negative amounts make sense.
    #[error("{0:?} is negative")]
    Negative(String),
    /// A percentage that is not in 0..=100.
    #[error("{0:?} is not a percentage between 0% and 100%")]
    Percentage(String),
}

/// A parsed quantity: `mantissa × 10^exp10 × 1024^bin_pow`, with a sign.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quantity {
    negative: bool,
    mantissa: u128,
    exp10: i32,
    bin_pow: u32,
}

const MAX_DIGITS: usize = 30;

impl Quantity {
    /// Parses the Kubernetes quantity grammar.
    pub fn parse(s: &str) -> Result<Self, QuantityError> {
        let syntax = || QuantityError::Syntax(s.to_owned());
        let t = s.trim();
        let (negative, body) = match t.as_bytes().first() {
            Some(b'-') => (true, &t[1..]),
            Some(b'+') => (false, &t[1..]),
            _ => (false, t),
        };
        let num_end = body.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(body.len());
        let (number, suffix) = body.split_at(num_end);
        let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(syntax());
        }
        if frac_part.contains('.') {
            return Err(syntax());
        }
        let frac_part = frac_part.trim_end_matches('0');
        let joined = format!("{int_part}{frac_part}");
        let digits = joined.trim_start_matches('0');
        if digits.len() > MAX_DIGITS {
            return Err(QuantityError::Overflow(s.to_owned()));
        }
        let mantissa = if digits.is_empty() { 0 } else { digits.parse::<u128>().map_err(|_| syntax())? };
        let frac_len = i32::try_from(frac_part.len()).map_err(|_| syntax())?;
        let (suffix_exp10, bin_pow) = match suffix {
            "" => (0, 0),
            "Ki" => (0, 1),
            "Mi" => (0, 2),
            "Gi" => (0, 3),
            "Ti" => (0, 4),
            "Pi" => (0, 5),
            "Ei" => (0, 6),
            "n" => (-9, 0),
            "u" => (-6, 0),
            "m" => (-3, 0),
            "k" => (3, 0),
            "M" => (6, 0),
            "G" => (9, 0),
            "T" => (12, 0),
            "P" => (15, 0),
            "E" => (18, 0),
            exp if exp.starts_with(['e', 'E']) => {
                let e = &exp[1..];
                let valid = !e.is_empty() && e.trim_start_matches(['+', '-']).chars().all(|c| c.is_ascii_digit());
                if !valid || e.trim_start_matches(['+', '-']).is_empty() {
                    return Err(syntax());
                }
                let e: i32 = e.parse().map_err(|_| syntax())?;
                if !(-100..=100).contains(&e) {
                    return Err(QuantityError::Overflow(s.to_owned()));
                }
                (e, 0)
            }
            _ => return Err(syntax()),
        };
        Ok(Self { negative: negative && mantissa != 0, mantissa, exp10: suffix_exp10 - frac_len, bin_pow })
    }

    /// True for a value below zero.
    pub fn is_negative(&self) -> bool {
        self.negative
    }

    /// The value in base units (bytes, cores, count), rounded up.
    pub fn value(&self) -> Option<i64> {
        self.scaled(0)
    }

    /// The value in thousandths of the base unit (millicores), rounded up.
    pub fn milli_value(&self) -> Option<i64> {
        self.scaled(3)
    }

    fn scaled(&self, extra_exp10: i32) -> Option<i64> {
        let mut n = self.mantissa.checked_mul(1u128.checked_shl(10 * self.bin_pow)?)?;
        let exp = self.exp10 + extra_exp10;
        if exp >= 0 {
            n = n.checked_mul(10u128.checked_pow(u32::try_from(exp).ok()?)?)?;
        } else {
            let d = 10u128.checked_pow(exp.unsigned_abs());
            n = match d {
                Some(d) => {
                    // Round up away from zero for positives; towards zero (which is "up") for negatives.
                    if self.negative { n / d } else { n.div_ceil(d) }
                }
                None => u128::from(n != 0 && !self.negative),
            };
        }
        let v = i64::try_from(n).ok()?;
        Some(if self.negative { -v } else { v })
    }
}

/// Parses a non-negative quantity in base units (bytes or a count).
pub fn parse_non_negative(s: &str) -> Result<u64, QuantityError> {
    let q = Quantity::parse(s)?;
    if q.is_negative() {
        return Err(QuantityError::Negative(s.to_owned()));
    }
    let v = q.value().ok_or_else(|| QuantityError::Overflow(s.to_owned()))?;
    u64::try_from(v).map_err(|_| QuantityError::Negative(s.to_owned()))
}

/// Parses a non-negative CPU quantity into millicores.
pub fn parse_millicores(s: &str) -> Result<u64, QuantityError> {
    let q = Quantity::parse(s)?;
    if q.is_negative() {
        return Err(QuantityError::Negative(s.to_owned()));
    }
    let v = q.milli_value().ok_or_else(|| QuantityError::Overflow(s.to_owned()))?;
    u64::try_from(v).map_err(|_| QuantityError::Negative(s.to_owned()))
}

/// An amount given either as a quantity or as a percentage of capacity, as eviction thresholds are
/// (`memory.available: "100Mi"`, `nodefs.available: "10%"`).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub enum Amount {
    /// An absolute amount in base units.
    Quantity(u64),
    /// A fraction of capacity, between 0 and 1.
    Percentage(f64),
}

impl Amount {
    /// Parses `"100Mi"` or `"10%"`. Percentages must lie in 0..=100.
    pub fn parse(s: &str) -> Result<Self, QuantityError> {
        let t = s.trim();
        if let Some(p) = t.strip_suffix('%') {
            let pct: f64 = p.trim().parse().map_err(|_| QuantityError::Percentage(s.to_owned()))?;
            if !(0.0..=100.0).contains(&pct) || !pct.is_finite() {
                return Err(QuantityError::Percentage(s.to_owned()));
            }
            return Ok(Amount::Percentage(pct / 100.0));
        }
        parse_non_negative(t).map(Amount::Quantity)
    }

    /// The amount in base units for a resource of the given capacity.
    pub fn resolve(&self, capacity: u64) -> u64 {
        match *self {
            Amount::Quantity(q) => q,
            // Truncation towards zero, as the kubelet converts `capacity * percentage` to an integer.
            #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            Amount::Percentage(p) => (capacity as f64 * p) as u64,
        }
    }

    /// True when the amount is zero (a disabled threshold).
    pub fn is_zero(&self) -> bool {
        match *self {
            Amount::Quantity(q) => q == 0,
            Amount::Percentage(p) => p == 0.0,
        }
    }
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Amount::Quantity(q) => write!(f, "{q}"),
            Amount::Percentage(p) => write!(f, "{}%", p * 100.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn table() {
        let cases: &[(&str, i64, i64)] = &[
            ("0", 0, 0),
            ("100Mi", 100 << 20, (100 << 20) * 1000),
            ("1Gi", 1 << 30, (1 << 30) * 1000),
            ("1.5Gi", 3 << 29, (3 << 29) * 1000),
            ("500m", 1, 500),
            ("0.1", 1, 100),
            ("2", 2, 2000),
            ("1k", 1000, 1_000_000),
            ("1M", 1_000_000, 1_000_000_000),
            ("128974848", 128_974_848, 128_974_848_000),
            ("129e6", 129_000_000, 129_000_000_000),
            ("1E3", 1000, 1_000_000),
            ("12e-3", 1, 12),
            ("1u", 1, 1),
            ("-1", -1, -1000),
            ("-500m", 0, -500),
            (".5", 1, 500),
            ("5.", 5, 5000),
            ("1.000Ki", 1024, 1_024_000),
            ("+7", 7, 7000),
        ];
        for &(s, v, mv) in cases {
            let q = Quantity::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"));
            assert_eq!(q.value(), Some(v), "value of {s}");
            assert_eq!(q.milli_value(), Some(mv), "milli value of {s}");
        }
    }

    #[test]
    fn refusals() {
        for bad in ["", "Mi", "1.2.3", "1Mb", "1 Gi", "1e", "1e+", "--1", "abc", ".", "1i", "1e1000"] {
            assert!(Quantity::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(parse_non_negative("-1Mi"), Err(QuantityError::Negative("-1Mi".into())));
        assert!(matches!(parse_non_negative("100Ei"), Err(QuantityError::Overflow(_))));
        assert_eq!(parse_millicores("250m"), Ok(250));
        assert_eq!(parse_millicores("1.5"), Ok(1500));
    }

    #[test]
    fn amounts() {
        assert_eq!(Amount::parse("100Mi"), Ok(Amount::Quantity(100 << 20)));
        assert_eq!(Amount::parse("10%"), Ok(Amount::Percentage(0.1)));
        assert_eq!(Amount::parse("10%").unwrap().resolve(1000), 100);
        assert_eq!(Amount::parse("7.5%").unwrap().resolve(1000), 75);
        for bad in ["101%", "-1%", "x%", "%", "-5Mi", "NaN%"] {
            assert!(Amount::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(Amount::parse("0%").unwrap().is_zero());
    }

    proptest! {
        #[test]
        fn never_panics(s in "\\PC{0,40}") {
            if let Ok(q) = Quantity::parse(&s) {
                let _ = q.value();
                let _ = q.milli_value();
            }
            let _ = Amount::parse(&s);
        }

        #[test]
        fn integers_round_trip(n in 0i64..(1 << 50), suffix in prop::sample::select(vec![("", 1i64), ("Ki", 1024), ("k", 1000), ("Mi", 1 << 20)])) {
            let q = Quantity::parse(&format!("{n}{}", suffix.0)).unwrap();
            prop_assert_eq!(q.value(), n.checked_mul(suffix.1));
        }

        #[test]
        fn milli_is_value_times_1000_for_integers(n in 0i64..1_000_000_000) {
            let q = Quantity::parse(&n.to_string()).unwrap();
            prop_assert_eq!(q.milli_value(), Some(n * 1000));
        }
    }
}
