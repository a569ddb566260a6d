//! Durations written the Go way (`2160h`, `1h30m`, `90s`), as the original MARIN3R's
//! `metav1.Duration` fields are.
//!
//! Not `kube::core::Duration`, the type made for this: its parser panics on a duration longer
//! than Rust's `Duration` holds (`99999999999999999999999h`), and tenants write these fields,
//! so a field of that type would let one object stop the controller decoding it. The fields
//! stay strings, read with this parser, which refuses such a value with an error (the test
//! `kubes_duration_parser_panics_where_ours_refuses` fails once kube's stops panicking).

use std::time::Duration;

/// Parses a Go duration: one or more `<number><unit>` with units `ns`, `us`, `µs`, `ms`, `s`,
/// `m`, `h` (decimals allowed, no sign). `0` alone is zero.
pub fn parse_go_duration(text: &str) -> Result<Duration, String> {
    let bad = |why: &str| format!("invalid duration {text:?}: {why}");
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() {
        return Err(bad("empty"));
    }
    if text.starts_with('-') {
        return Err(bad("must not be negative"));
    }
    let mut total = 0f64;
    let mut rest = text;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| bad("missing unit (ns, us, ms, s, m, h)"))?;
        let (number, tail) = rest.split_at(number_len);
        if number.is_empty() {
            return Err(bad(&format!("{rest:?} does not start with a number")));
        }
        let value: f64 = number
            .parse()
            .map_err(|_| bad(&format!("{number:?} is not a number")))?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let seconds = match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad(&format!("unknown unit {unit:?}"))),
        };
        total += value * seconds;
        rest = tail;
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad("out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_parse() {
        for (text, secs) in [
            ("2160h", 2160.0 * 3600.0),
            ("1h30m", 5400.0),
            ("90s", 90.0),
            ("1.5h", 5400.0),
            ("500ms", 0.5),
            ("0", 0.0),
            ("1h0m0s", 3600.0),
        ] {
            assert_eq!(
                parse_go_duration(text).unwrap().as_secs_f64(),
                secs,
                "{text}"
            );
        }
    }

    #[test]
    fn kubes_duration_parser_panics_where_ours_refuses() {
        let text = "99999999999999999999999h";
        let kube = std::panic::catch_unwind(|| text.parse::<kube_core::Duration>());
        assert!(kube.is_err(), "kube's parser no longer panics: {kube:?}");
        let ours = parse_go_duration(text).unwrap_err();
        assert!(ours.contains("out of range"), "{ours}");
        // Where both read a value, they agree.
        for text in ["2160h", "1h30m", "1.5h", "500ms", "0"] {
            let kube: std::time::Duration = text.parse::<kube_core::Duration>().unwrap().into();
            assert_eq!(parse_go_duration(text).unwrap(), kube, "{text}");
        }
    }

    #[test]
    fn bad_durations_say_why() {
        for (text, why) in [
            ("", "empty"),
            ("10", "missing unit"),
            ("10d", "unknown unit \"d\""),
            ("-1h", "must not be negative"),
            ("h", "\"h\" does not start with a number"),
            ("1..2s", "is not a number"),
        ] {
            let err = parse_go_duration(text).unwrap_err();
            assert!(err.contains(why), "{text}: {err}");
            assert!(err.contains(&format!("{text:?}")), "{err}");
        }
    }
}
