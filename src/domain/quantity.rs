use super::{echo, InvalidInput};

/// How many units one order line takes: at least one, and small enough that a
/// typo cannot ask for the whole warehouse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Quantity(i32);

impl Quantity {
    pub const MAX: i32 = 100;

    pub fn new(units: i32) -> Result<Quantity, InvalidInput> {
        if (1..=Self::MAX).contains(&units) {
            Ok(Quantity(units))
        } else {
            Err(InvalidInput::QuantityOutOfBounds { max: Self::MAX })
        }
    }

    pub fn parse(raw: &str) -> Result<Quantity, InvalidInput> {
        let raw = raw.trim();
        if raw.is_empty() || raw.len() > 6 || !raw.bytes().all(|b| b.is_ascii_digit()) {
            return Err(InvalidInput::NotAQuantity {
                raw: echo(raw),
                max: Self::MAX,
            });
        }
        Quantity::new(raw.parse().map_err(|_| InvalidInput::QuantityOverflow)?)
    }

    pub fn get(self) -> i32 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_one_to_max() {
        assert_eq!(Quantity::parse("1").unwrap().get(), 1);
        assert_eq!(Quantity::parse(" 7 ").unwrap().get(), 7);
        assert_eq!(Quantity::parse("100").unwrap().get(), 100);
    }

    #[test]
    fn refuses_everything_else() {
        for bad in [
            "0",
            "-1",
            "abc",
            "",
            "101",
            "1000000000000",
            "1.5",
            "٣",
            "1\0",
        ] {
            assert!(Quantity::parse(bad).is_err(), "{bad:?} should be refused");
        }
    }
}
