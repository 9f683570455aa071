//! A buy in queue mode takes its pass before anything else (`claim`), and
//! hands it back when the purchase wrote nothing (`unclaim`); a purchase
//! that committed records it used (`admissions::record_used`).

use super::join::queue_sale;
use super::opening::{ensure_queue, Readied};
use super::sale::closed;
use crate::domain::{CustomerId, ProductId};
use crate::error::{AppError, PassRefusal};
use crate::queue::{Claim, PassRef};
use crate::services::Shop;

/// Takes `customer`'s `pass` for the purchase `admission`, or says why not.
/// A refusal leaves Redis as it was (an issued pass found past its
/// deadline lapses, as it would at the next sweep).
pub async fn claim(
    shop: &Shop,
    product: ProductId,
    customer: CustomerId,
    pass: &PassRef,
    admission: &str,
) -> Result<Result<i64, PassRefusal>, AppError> {
    let room = &shop.waiting_room;
    let mut claimed = room.claim(product, customer, pass, admission).await?;
    if claimed == Claim::Missing {
        // Redis lost the queue: rebuilt from Postgres, passes issued there
        // are open again.
        let sale = queue_sale(shop, product).await?;
        match ensure_queue(shop, &sale).await? {
            Readied::Rebuilding => {
                return Err(AppError::Unavailable(
                    "the waiting room is being rebuilt; try again".into(),
                ))
            }
            Readied::Retired => return Err(closed(&sale.name)),
            Readied::Present | Readied::Prepared | Readied::Rebuilt => {}
        }
        claimed = room.claim(product, customer, pass, admission).await?;
    }
    Ok(match claimed {
        Claim::Claimed { units } => Ok(units),
        Claim::NoPass => Err(PassRefusal::NoPass),
        Claim::Forged => Err(PassRefusal::Forged),
        Claim::NotYours => Err(PassRefusal::NotYours),
        Claim::Lapsed => Err(PassRefusal::Lapsed),
        Claim::Used => Err(PassRefusal::Used),
        Claim::InUse => Err(PassRefusal::InUse),
        Claim::Missing => {
            return Err(AppError::Unavailable(
                "the waiting room is being rebuilt; try again".into(),
            ))
        }
    })
}

/// The purchase under the claim wrote nothing: the pass is open again
/// until its deadline. Best effort: a claim left behind is resolved by the
/// tick once its grace has passed (no order under it: it lapses).
pub async fn unclaim(shop: &Shop, product: ProductId, pass: &PassRef, admission: &str) {
    if let Err(error) = shop.waiting_room.unclaim(product, pass, admission).await {
        tracing::warn!(%product, %pass, %error, "could not hand a pass back; the tick will lapse it after its grace");
    }
}
