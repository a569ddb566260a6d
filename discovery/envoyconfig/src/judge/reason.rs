//! What a user is told of Envoy's refusal: its reason on one line of bounded length, and
//! whether that reason is only a file the judge cannot have (it lives in the proxy's pod).

use serde_json::Value;

/// The longest reason passed on, in characters.
pub const MAX_REASON: usize = 600;

/// What precedes Envoy's reason in validate mode's output (then the file, `': `).
const MARKER: &str = "error initializing configuration '";

/// Protobuf's marker before a message's debug dump, randomised on purpose (`goo.gle/debugstr`,
/// `goo.gle/debugonly`...).
const DEBUG_DUMP: &str = "goo.gle/debug";

/// Envoy's reason for refusing, from its output, on one line of at most [`MAX_REASON`]
/// characters, control characters escaped. A proto-constraint failure is printed by Envoy
/// after a dump of the message that failed (the user's own config, over many lines): only
/// the failure is kept.
pub fn of(output: &str) -> String {
    let reason = match output
        .split_once(MARKER)
        .and_then(|(_, rest)| rest.split_once("': "))
    {
        Some((_, rest)) => after_marker(rest),
        None => output
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty() && !l.contains("[backtrace]"))
            .unwrap_or("Envoy refused the configuration without saying why"),
    };
    one_line(reason)
}

fn after_marker(rest: &str) -> &str {
    if let Some(at) = rest.find("Proto constraint validation failed") {
        return first_line(&rest[at..]);
    }
    let first = first_line(rest);
    if !first.trim_start().starts_with(DEBUG_DUMP) {
        return first;
    }
    // `goo.gle/debugstr <dump of the message>\n: <reason>`: the reason is the last line.
    rest.lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map_or(first, |l| l.trim_start_matches(':').trim_start())
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or_default()
}

/// `text` with control characters escaped and cut to [`MAX_REASON`] characters.
pub fn one_line(text: &str) -> String {
    let mut out = String::new();
    for (count, c) in text.trim().chars().enumerate() {
        if count == MAX_REASON {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// The shapes of Envoy's messages about a file it cannot read or write.
const FILE_ERRORS: [&str; 10] = [
    "Invalid path: ",
    "from path: ",
    "Failed to load ",
    "failed to read",
    "unable to read file: ",
    "unable to open file ",
    "does not exist",
    "No such file or directory",
    "Permission denied",
    "cannot be read",
];

/// Whether `reason` is Envoy failing on a file one of `values` names: an absolute path written
/// in the config (under whatever field: a data source's `filename`, an SDS `path`, a Lua
/// module, a GeoIP database) that appears in the reason as a whole path, in one of Envoy's
/// file-error shapes. Such a file is in the proxy's pod, not the judge's.
pub fn names_a_file_of<'v>(reason: &str, values: impl IntoIterator<Item = &'v Value>) -> bool {
    if !FILE_ERRORS.iter().any(|shape| reason.contains(shape)) {
        return false;
    }
    let words: Vec<&str> = reason
        .split(|c: char| c.is_whitespace() || matches!(c, '\'' | '"' | ',' | '(' | ')' | '`'))
        .map(|w| w.trim_end_matches([':', '.']))
        .filter(|w| w.starts_with('/'))
        .collect();
    let mut paths = Vec::new();
    values
        .into_iter()
        .for_each(|v| absolute_paths(v, &mut paths));
    paths.iter().any(|p| words.contains(&p.as_str()))
}

fn absolute_paths(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(s) if s.starts_with('/') && s.len() > 1 => out.push(s.clone()),
        Value::Array(items) => items.iter().for_each(|i| absolute_paths(i, out)),
        Value::Object(map) => map.values().for_each(|v| absolute_paths(v, out)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_reason_is_the_text_after_envoys_marker() {
        let out = "[info] loading\n[critical][main] [server.cc:76] error initializing configuration '/dev/stdin': Didn't find a registered implementation for 'r' with type URL: ''\n";
        assert_eq!(
            of(out),
            "Didn't find a registered implementation for 'r' with type URL: ''"
        );
        assert_eq!(of("a\nlast words\n\n"), "last words");
    }

    #[test]
    fn a_proto_constraint_failure_keeps_its_reason_not_the_dump_before_it() {
        let out = "[critical][main] [server.cc:76] error initializing configuration '/dev/stdin': goo.gle/debugstr  \nstat_prefix: \"s\"\nroute_config {\n  name: \"secret-ish\"\n}\n: Proto constraint validation failed (HeaderMatcherValidationError.Name: value length must be at least 1 characters)\n";
        assert_eq!(
            of(out),
            "Proto constraint validation failed (HeaderMatcherValidationError.Name: value length must be at least 1 characters)"
        );
        let other = "error initializing configuration '/dev/stdin': goo.gle/debugonly x {\n}\n: something else went wrong\n";
        assert_eq!(of(other), "something else went wrong");
    }

    #[test]
    fn a_reason_is_one_bounded_line() {
        let long = format!(
            "error initializing configuration '/dev/stdin': {}",
            "x".repeat(5000)
        );
        let reason = of(&long);
        assert_eq!(reason.chars().count(), MAX_REASON + 1);
        assert!(reason.ends_with('…'));
        assert_eq!(one_line("a\u{1b}[31mb\tc"), "a\\u{1b}[31mb\\tc");
        assert!(!of("boom\n[critical][backtrace] #1 0x1\n").contains("backtrace"));
    }

    #[test]
    fn a_file_is_recognised_by_its_whole_path_in_a_file_error() {
        let value = json!({"tls": {"filename": "/etc/certs/ca.pem"}, "body": {"filename": "e"}});
        let values = [&value];
        assert!(names_a_file_of(
            "Invalid path: /etc/certs/ca.pem",
            values.iter().copied()
        ));
        assert!(names_a_file_of(
            "unable to open file '/etc/certs/ca.pem': Permission denied",
            values.iter().copied()
        ));
        // A short name matches nothing: only whole absolute paths count.
        assert!(!names_a_file_of(
            "Didn't find a registered implementation for 'envoy.filters.http.buffer' with type URL: ''",
            values.iter().copied()
        ));
        // A path inside a longer one is not that path.
        assert!(!names_a_file_of(
            "Invalid path: /etc/certs/ca.pem.bak",
            values.iter().copied()
        ));
        // The path named, but not a file error: Envoy's refusal stands.
        assert!(!names_a_file_of(
            "route prefix /etc/certs/ca.pem is malformed",
            values.iter().copied()
        ));
    }
}
