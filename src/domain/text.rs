use super::{InvalidInput, TextField};

/// Whether a free-text field may hold line breaks (a description) or not (a name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lines {
    One,
    Many,
}

/// Checks text a person typed into a free-text field. Postgres refuses NUL
/// in `text` columns (the insert would fail as a server error), and other
/// control characters only hide what a page will show, so both are refused
/// here with a message naming the field.
pub fn check_plain_text(raw: &str, field: TextField, lines: Lines) -> Result<(), InvalidInput> {
    let allowed = |c: char| lines == Lines::Many && matches!(c, '\n' | '\r' | '\t');
    if raw.chars().any(|c| c.is_control() && !allowed(c)) {
        return Err(InvalidInput::ControlCharacters { field });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_control_characters_except_line_breaks_where_allowed() {
        assert!(check_plain_text(
            "Café <b>ok</b> ' OR 1=1 --",
            TextField::ProductName,
            Lines::One
        )
        .is_ok());
        assert!(check_plain_text("a\0b", TextField::ProductName, Lines::One).is_err());
        assert!(check_plain_text("a\nb", TextField::ProductName, Lines::One).is_err());
        assert!(check_plain_text("a\r\n\tb", TextField::Description, Lines::Many).is_ok());
        assert!(check_plain_text("a\0b", TextField::Description, Lines::Many).is_err());
        assert!(check_plain_text("a\u{1b}[31m", TextField::Description, Lines::Many).is_err());
    }
}
