use std::fmt;

use super::{echo, InvalidInput};

/// An amount in the shop's currency, kept in integer minor units (cents) so
/// sums are exact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Money {
    cents: i64,
}

impl Money {
    pub const CURRENCY: &'static str = "USD";

    pub fn from_cents(cents: i64) -> Result<Money, InvalidInput> {
        if cents < 0 {
            return Err(InvalidInput::NegativePrice);
        }
        Ok(Money { cents })
    }

    pub fn cents(self) -> i64 {
        self.cents
    }

    pub fn times(self, quantity: i32) -> Money {
        Money {
            cents: self.cents * i64::from(quantity),
        }
    }

    /// Parses what a person types in a price field: "12", "12.5", "12.50",
    /// and prices as the shop prints them ("$1,234.50").
    pub fn parse_decimal(raw: &str) -> Result<Money, InvalidInput> {
        let refuse = || InvalidInput::NotAPrice { raw: echo(raw) };
        let trimmed = raw.trim();
        let trimmed = trimmed.strip_prefix('$').unwrap_or(trimmed);
        let (grouped_whole, fraction) = match trimmed.split_once('.') {
            Some((w, f)) => (w, f),
            None => (trimmed, ""),
        };
        let whole = without_thousands_separators(grouped_whole).ok_or_else(refuse)?;
        if whole.is_empty() || whole.len() > 9 || !whole.bytes().all(|b| b.is_ascii_digit()) {
            return Err(refuse());
        }
        if trimmed.ends_with('.')
            || fraction.len() > 2
            || !fraction.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(refuse());
        }
        let whole: i64 = whole.parse().map_err(|_| refuse())?;
        let fraction: i64 = match fraction.len() {
            0 => 0,
            1 => fraction.parse::<i64>().map_err(|_| refuse())? * 10,
            _ => fraction.parse().map_err(|_| refuse())?,
        };
        Money::from_cents(whole * 100 + fraction)
    }
}

/// "1,234,567" becomes "1234567"; commas anywhere but between groups of three
/// are refused, so "1,23" is not read as 123.
fn without_thousands_separators(whole: &str) -> Option<String> {
    let mut groups = whole.split(',');
    let first = groups.next().unwrap_or_default();
    let rest: Vec<&str> = groups.collect();
    if rest.is_empty() {
        return Some(first.to_owned());
    }
    if first.is_empty() || first.len() > 3 || rest.iter().any(|group| group.len() != 3) {
        return None;
    }
    Some(std::iter::once(first).chain(rest).collect())
}

impl fmt::Display for Money {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whole = grouped_thousands(self.cents / 100);
        write!(f, "${}.{:02}", whole, self.cents % 100)
    }
}

/// "10,000,000": a whole number with its thousands grouped, as the shop
/// writes every count and amount.
pub fn grouped_thousands(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3 + 1);
    if n < 0 {
        out.push('-');
    }
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_with_currency_and_grouping() {
        assert_eq!(Money::from_cents(0).unwrap().to_string(), "$0.00");
        assert_eq!(Money::from_cents(1999).unwrap().to_string(), "$19.99");
        assert_eq!(
            Money::from_cents(123456789).unwrap().to_string(),
            "$1,234,567.89"
        );
    }

    #[test]
    fn parses_decimal_prices() {
        assert_eq!(Money::parse_decimal("12").unwrap().cents(), 1200);
        assert_eq!(Money::parse_decimal("12.5").unwrap().cents(), 1250);
        assert_eq!(Money::parse_decimal("$0.05").unwrap().cents(), 5);
        assert_eq!(Money::parse_decimal("$1,234.50").unwrap().cents(), 123_450);
        for bad in [
            "",
            "-1",
            "1.234",
            "abc",
            "1e3",
            "12.",
            ".5x",
            "9999999999",
            "$$5",
            "1,23",
            ",123",
            "1,2345",
            "1234,567",
        ] {
            assert!(
                Money::parse_decimal(bad).is_err(),
                "{bad:?} should be refused"
            );
        }
        assert!(Money::from_cents(-1).is_err());
    }

    #[test]
    fn multiplies_by_quantity() {
        assert_eq!(Money::from_cents(250).unwrap().times(3).cents(), 750);
    }
}
