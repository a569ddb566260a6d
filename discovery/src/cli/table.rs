//! The column tables the CLI prints (`proxy-status`, `proxy-config`), as kubectl prints its
//! own: every column as wide as its widest cell, three spaces apart, no trailing blanks.

/// `rows` (the header first) as aligned lines, each ending with a newline.
pub(super) fn aligned<R: AsRef<[String]>>(rows: &[R]) -> String {
    let columns = rows.iter().map(|r| r.as_ref().len()).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.as_ref().get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .as_ref()
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(line.join("   ").trim_end());
        out.push('\n');
    }
    out
}
