//! Kubernetes resource quantities (`100m`, `1.5Gi`, `2e3`): validation and an approximate
//! numeric value, enough to check that a request does not exceed its limit.

/// Parses a quantity as the API server's grammar does and returns its value (in cores for CPU,
/// bytes for memory). The error says what is wrong.
pub fn parse_quantity(s: &str) -> Result<f64, String> {
    if s.is_empty() {
        return Err("a quantity must not be empty".into());
    }
    if s.len() > 64 {
        return Err("quantity is too long".into());
    }
    let (sign, rest) = match s.as_bytes()[0] {
        b'+' => (1.0, &s[1..]),
        b'-' => (-1.0, &s[1..]),
        _ => (1.0, s),
    };
    let number_end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(number_end);
    let digits_ok = {
        let mut parts = number.splitn(2, '.');
        let whole = parts.next().unwrap_or("");
        let frac = parts.next();
        !number.is_empty()
            && !frac.is_some_and(|f| f.contains('.'))
            && (!whole.is_empty() || frac.is_some_and(|f| !f.is_empty()))
    };
    if !digits_ok {
        return Err(
            "not a Kubernetes quantity (expected a number with an optional suffix such as m, Mi, G)"
                .into(),
        );
    }
    let value: f64 = number
        .parse()
        .map_err(|_| "not a Kubernetes quantity".to_string())?;
    let multiplier = suffix_multiplier(suffix)?;
    let value = sign * value * multiplier;
    if value < 0.0 {
        return Err("a resource quantity must not be negative".into());
    }
    if !value.is_finite() {
        return Err("quantity is too large".into());
    }
    Ok(value)
}

/// The factor a quantity suffix stands for: SI, binary, or an exponent (`e3`).
fn suffix_multiplier(suffix: &str) -> Result<f64, String> {
    Ok(match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        other => {
            let exponent = other
                .strip_prefix(['e', 'E'])
                .filter(|e| !e.is_empty() && e.len() <= 4)
                .and_then(|e| e.parse::<i32>().ok())
                .ok_or_else(|| {
                    format!(
                        "unknown quantity suffix {other:?} (expected one of n, u, m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei or an exponent such as e3)"
                    )
                })?;
            10f64.powi(exponent)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_quantities_have_their_value() {
        for (q, v) in [
            ("1", 1.0),
            ("100m", 0.1),
            ("0.5", 0.5),
            (".5", 0.5),
            ("5.", 5.0),
            ("+2", 2.0),
            ("128Mi", 134_217_728.0),
            ("1Gi", 1_073_741_824.0),
            ("1G", 1e9),
            ("2e3", 2000.0),
            ("1E-3", 0.001),
            ("1500u", 0.0015),
            ("0", 0.0),
        ] {
            let got = parse_quantity(q).unwrap();
            assert!((got - v).abs() <= v * 1e-12, "{q}: {got} != {v}");
        }
    }

    #[test]
    fn invalid_quantities_are_refused() {
        for q in [
            "", "abc", "1.2.3", "1Mb", "Mi", "-1", "1 Gi", "1e", ".", "1ki", "0x10", "1e99999",
        ] {
            assert!(parse_quantity(q).is_err(), "{q:?} was accepted");
        }
    }
}
