//! CSV as the appliance writes it (RFC 4180), the one writer every export
//! uses: a cell is quoted where it holds a comma, a quote or a line break,
//! and one a spreadsheet would take as a formula (starting with `=`, `+`,
//! `-`, `@`, a tab or a carriage return) is neutralised with a leading `'`.

/// One cell, ready for a line.
pub fn cell(text: &str) -> String {
    let text = if text.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{text}")
    } else {
        text.to_string()
    };
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text
    }
}

/// One line of cells, without its line break.
pub fn line<S: AsRef<str>>(cells: impl IntoIterator<Item = S>) -> String {
    cells
        .into_iter()
        .map(|c| cell(c.as_ref()))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formulas_are_neutralised_and_separators_quoted() {
        for (text, written) in [
            ("plain", "plain"),
            ("=1+1", "'=1+1"),
            ("+1", "'+1"),
            ("-2", "'-2"),
            ("@SUM(A1)", "'@SUM(A1)"),
            ("\tx", "'\tx"),
            ("\rx", "\"'\rx\""),
            ("a,b", "\"a,b\""),
            ("say \"hi\"", "\"say \"\"hi\"\"\""),
        ] {
            assert_eq!(cell(text), written, "{text:?}");
        }
        assert_eq!(line(["a", "-b", "c,d"]), "a,'-b,\"c,d\"");
    }
}
