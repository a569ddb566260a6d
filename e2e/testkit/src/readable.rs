//! Whether what a command prints for people shows Rust's `Debug` formatting (`Some("x")`,
//! `Os { code: 2, kind: NotFound, .. }`), which users should never read.

/// The first line of `text` that shows `Debug` formatting, if any.
pub fn debug_line(text: &str) -> Option<&str> {
    text.lines().find(|line| shows_debug(line))
}

/// `Some(`, `Ok(`, `Err(` as words, a `None` inside a structure, or a struct printed as
/// `Name { field: ...`.
fn shows_debug(line: &str) -> bool {
    const WRAPPERS: [&str; 3] = ["Some(", "Ok(", "Err("];
    const NONES: [&str; 4] = ["(None", "None)", ": None,", ": None }"];
    let word_at = |i: usize| {
        !line[..i]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
    };
    let wrapped = WRAPPERS
        .iter()
        .any(|w| line.match_indices(w).any(|(i, _)| word_at(i)));
    wrapped || NONES.iter().any(|n| line.contains(n)) || struct_debug(line)
}

/// `Name { field: ` : a capitalised name, ` { `, a snake_case field and `: `.
fn struct_debug(line: &str) -> bool {
    line.match_indices(" { ").any(|(i, _)| {
        let name = line[..i]
            .rsplit(|c: char| !c.is_alphanumeric() && c != '_')
            .next()
            .unwrap_or_default();
        let rest = &line[i + 3..];
        let field: String = rest
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        name.starts_with(|c: char| c.is_ascii_uppercase())
            && !field.is_empty()
            && rest[field.len()..].starts_with(": ")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_formatting_is_found_and_prose_is_not() {
        for debug in [
            "EnvoyConfig a/b: not published (Some(\"Rollback\"))",
            "error: Os { code: 2, kind: NotFound, message: \"No such file\" }",
            "state: Ok(())",
            "value: (None, 3)",
            "Config { name: None, port: 1 }",
        ] {
            assert_eq!(debug_line(debug), Some(debug), "{debug}");
        }
        for prose in [
            "[ok]   CRD envoyconfigs.marin3r.3scale.net: current (0.1.0)",
            "sideEffects: None",
            "Awesome(ly) written: Okay (fine)",
            "{ \"name\": \"x\" }",
            "match { x: 1 }",
            "A { } B",
        ] {
            assert_eq!(debug_line(prose), None, "{prose}");
        }
    }
}
