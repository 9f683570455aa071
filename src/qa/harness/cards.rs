//! The sandbox provider's test cards, written as a customer types them (the
//! card parser drops the spaces).

pub const GOOD_CARD: &str = "4242 4242 4242 4242";
pub const DECLINED_CARD: &str = "4000 0000 0000 0002";
/// Approved, after longer than the shop waits for an answer.
pub const SLOW_CARD: &str = "4000 0000 0000 0077";
/// Approved, and the answer is lost on its way back to the shop.
pub const LOST_ANSWER_CARD: &str = "4000 0000 0000 0093";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::CardNumber;
    use crate::payment::SandboxProvider;

    #[test]
    fn the_cards_are_the_sandbox_providers() {
        let digits = |raw: &str| CardNumber::parse(raw).unwrap().digits().to_string();
        assert_eq!(digits(GOOD_CARD), SandboxProvider::APPROVED_CARD);
        assert_eq!(digits(DECLINED_CARD), SandboxProvider::DECLINED_CARD);
        assert_eq!(digits(SLOW_CARD), SandboxProvider::SLOW_CARD);
        assert_eq!(digits(LOST_ANSWER_CARD), SandboxProvider::LOST_ANSWER_CARD);
    }
}
