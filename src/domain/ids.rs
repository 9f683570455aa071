use std::fmt;
use std::str::FromStr;

use super::{echo, IdKind, InvalidInput};

macro_rules! id_type {
    ($name:ident, $kind:ident) => {
        #[derive(
            Debug,
            Clone,
            Copy,
            PartialEq,
            Eq,
            PartialOrd,
            Ord,
            Hash,
            serde::Serialize,
            serde::Deserialize,
        )]
        #[serde(transparent)]
        pub struct $name(pub i64);

        impl $name {
            pub fn get(self) -> i64 {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl FromStr for $name {
            type Err = InvalidInput;

            /// Path ids are positive decimal integers; anything else names no row.
            fn from_str(raw: &str) -> Result<Self, Self::Err> {
                match raw.parse::<i64>() {
                    Ok(id) if id > 0 && raw.bytes().all(|b| b.is_ascii_digit()) => Ok($name(id)),
                    _ => Err(InvalidInput::NoSuchId {
                        kind: IdKind::$kind,
                        raw: echo(raw),
                    }),
                }
            }
        }
    };
}

id_type!(ProductId, Product);
id_type!(OrderId, Order);
id_type!(CustomerId, Account);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_accept_positive_decimals_only() {
        assert_eq!("42".parse::<ProductId>().unwrap(), ProductId(42));
        for bad in [
            "0",
            "-1",
            "+1",
            "abc",
            "",
            "1e3",
            "99999999999999999999",
            " 1",
        ] {
            assert!(
                bad.parse::<ProductId>().is_err(),
                "{bad:?} should be refused"
            );
        }
    }
}
