//! A card number as a customer typed it, checked before any provider sees it.

use super::InvalidInput;

/// A card number that passed the Luhn check; only its last four digits are ever stored.
#[derive(Clone)]
pub struct CardNumber(String);

impl CardNumber {
    pub fn parse(raw: &str) -> Result<CardNumber, InvalidInput> {
        let digits: String = raw.chars().filter(|c| !matches!(c, ' ' | '-')).collect();
        let refuse = || InvalidInput::CardNumberShape;
        if !(12..=19).contains(&digits.len()) || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(refuse());
        }
        let luhn_sum: u32 = digits
            .bytes()
            .rev()
            .enumerate()
            .map(|(i, b)| {
                let d = u32::from(b - b'0');
                if i % 2 == 1 {
                    if d * 2 > 9 {
                        d * 2 - 9
                    } else {
                        d * 2
                    }
                } else {
                    d
                }
            })
            .sum();
        if !luhn_sum.is_multiple_of(10) {
            return Err(InvalidInput::CardCheckDigit);
        }
        Ok(CardNumber(digits))
    }

    pub fn last4(&self) -> &str {
        &self.0[self.0.len() - 4..]
    }

    /// The digits, for the payment provider alone: never stored or logged.
    pub fn digits(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for CardNumber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CardNumber(…{})", self.last4())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn card_numbers_are_luhn_checked() {
        assert_eq!(
            CardNumber::parse("4242 4242 4242 4242").unwrap().last4(),
            "4242"
        );
        assert_eq!(
            CardNumber::parse("4000-0000-0000-0002").unwrap().last4(),
            "0002"
        );
        for bad in [
            "",
            "4242",
            "4242 4242 4242 4241",
            "abcd abcd abcd abcd",
            "4242424242424242424242",
        ] {
            assert!(CardNumber::parse(bad).is_err(), "{bad:?} should be refused");
        }
    }
}
