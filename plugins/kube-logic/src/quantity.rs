//! Kubernetes resource quantities (`500m`, `1`, `1.5`, `2Gi`, `512Mi`, `1e3`, `1k`, `1M`) read
//! and compared as apimachinery's `resource.Quantity` does: binary SI suffixes (`Ki` … `Ei`),
//! decimal SI suffixes (`n`, `u`, `m`, `k`, `M`, `G`, `T`, `P`, `E`) and decimal exponents
//! (`e3`, `E-2`). Values are held exactly in units of 10⁻⁹, rounded up below that (as the API
//! rounds up). Pure arithmetic; knows nothing of containers or config keys.

use std::cmp::Ordering;
use std::fmt;

/// A parsed quantity: the text as written and its value in units of 10⁻⁹.
#[derive(Debug, Clone)]
pub struct Quantity {
    text: String,
    nanos: i128,
}

impl Quantity {
    /// Parse a quantity; the error says what is wrong with it.
    pub fn parse(text: &str) -> Result<Quantity, String> {
        let nanos = parse_nanos(text).ok_or_else(|| format!("{text:?} is not a Kubernetes quantity"))?;
        Ok(Quantity { text: text.to_string(), nanos })
    }

    /// The text as written (what the API is sent).
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The value in units of 10⁻⁹ (`500m` → 500 000 000).
    pub fn nanos(&self) -> i128 {
        self.nanos
    }

    /// Whether the value is below zero.
    pub fn is_negative(&self) -> bool {
        self.nanos < 0
    }
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.nanos == other.nanos
    }
}

impl Eq for Quantity {}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> Ordering {
        self.nanos.cmp(&other.nanos)
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// How a suffix scales the number: `base^exp` (base 2 or 10).
fn suffix_scale(suffix: &str) -> Option<(u32, i32)> {
    let binary = |exp| Some((2, exp));
    let decimal = |exp| Some((10, exp));
    match suffix {
        "Ki" => binary(10),
        "Mi" => binary(20),
        "Gi" => binary(30),
        "Ti" => binary(40),
        "Pi" => binary(50),
        "Ei" => binary(60),
        "n" => decimal(-9),
        "u" => decimal(-6),
        "m" => decimal(-3),
        "" => decimal(0),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        _ => {
            // A decimal exponent: `e3`, `E-2`, `e+6`.
            let digits = suffix.strip_prefix(['e', 'E'])?;
            let unsigned = digits.strip_prefix(['+', '-']).unwrap_or(digits);
            if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) || unsigned.len() > 4 {
                return None;
            }
            decimal(digits.parse().ok()?)
        }
    }
}

/// The value of `text` in units of 10⁻⁹, rounded up; `None` when it is not a quantity or too large.
fn parse_nanos(text: &str) -> Option<i128> {
    let (negative, rest) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let number_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(number_end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
        return None;
    }
    let (base, exp) = suffix_scale(suffix)?;
    // The digits as one integer `mantissa`, worth mantissa × 10^-fraction.len().
    let digits = format!("{whole}{fraction}");
    let digits = digits.trim_start_matches('0');
    if digits.len() > 30 {
        return None;
    }
    let mantissa: i128 = if digits.is_empty() { 0 } else { digits.parse().ok()? };
    // value = mantissa × 10^(9 - fraction.len()) × scale, in nanos.
    let mut numerator = mantissa;
    let mut denominator: i128 = 1;
    let mut ten_exp = 9 - fraction.len() as i32;
    if base == 2 {
        numerator = numerator.checked_mul(1i128.checked_shl(exp as u32)?)?;
    } else {
        ten_exp += exp;
    }
    if ten_exp >= 0 {
        numerator = numerator.checked_mul(10i128.checked_pow(ten_exp as u32)?)?;
    } else {
        denominator = 10i128.checked_pow(ten_exp.unsigned_abs())?;
    }
    let nanos = numerator / denominator + i128::from(numerator % denominator != 0);
    Some(if negative { -nanos } else { nanos })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(text: &str) -> i128 {
        Quantity::parse(text).unwrap().nanos()
    }

    #[test]
    fn suffixes_scale_as_apimachinery_does() {
        let g = 1_000_000_000i128;
        for (text, nanos) in [
            ("1", g),
            ("0", 0),
            ("500m", g / 2),
            ("1.5", 3 * g / 2),
            (".5", g / 2),
            ("2.", 2 * g),
            ("100n", 100),
            ("3u", 3000),
            ("1k", 1000 * g),
            ("1M", 1_000_000 * g),
            ("1G", 1_000_000_000 * g),
            ("1Ki", 1024 * g),
            ("512Mi", 512 * (1 << 20) * g),
            ("2Gi", 2 * (1 << 30) * g),
            ("1Ei", (1i128 << 60) * g),
            ("1e3", 1000 * g),
            ("1E3", 1000 * g),
            ("15e-1", 3 * g / 2),
            ("1e+2", 100 * g),
            ("1E", 1_000_000_000_000_000_000 * g),
            ("-1", -g),
            ("+2", 2 * g),
            ("1.5Gi", 3 * (1 << 29) * g),
            ("0.1m", 100_000),
        ] {
            assert_eq!(n(text), nanos, "{text}");
        }
    }

    #[test]
    fn precision_below_nanos_rounds_up() {
        assert_eq!(n("0.1n"), 1);
        assert_eq!(n("1e-12"), 1);
        assert_eq!(n("1.0000000001"), 1_000_000_001);
    }

    #[test]
    fn malformed_quantities_are_errors() {
        for bad in
            ["", "abc", "1.2.3", "1 Gi", "1gi", "1KI", "Gi", "1x", "1e", "e3", "1e1.5", "-", ".", "1Mi2", "1e99999"]
        {
            let err = Quantity::parse(bad).unwrap_err();
            assert!(err.contains("is not a Kubernetes quantity"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn comparison_ignores_notation() {
        let q = |t: &str| Quantity::parse(t).unwrap();
        assert_eq!(q("1"), q("1000m"));
        assert_eq!(q("1Ki"), q("1024"));
        assert_eq!(q("1k"), q("1e3"));
        assert!(q("1Gi") > q("1G"));
        assert!(q("500m") < q("1"));
        assert!(q("2") > q("1500m"));
        assert!(q("128Mi") < q("1Gi"));
        assert_eq!(q("2Gi").as_str(), "2Gi");
        assert!(q("-1").is_negative());
    }
}
