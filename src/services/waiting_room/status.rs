//! One customer's standing in a waiting room, for the waiting page and
//! `queue.json`, polled by everyone waiting: built from this process's
//! snapshot of the room (at most `FRESH_FOR` old) and the customer's
//! place, which is read once and then kept.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::places::{ended_pass_of, place_of};
use super::rooms::{snapshot, RoomSnapshot};
use super::sale::{queue_sale, QueueSale};
use crate::domain::draw::{EntriesCommitment, PassState, SeedCommitment, Ticket};
use crate::domain::{CustomerId, PassRef, ProductId, QueueState, Standing};
use crate::error::AppError;
use crate::services::Shop;

/// One customer's view of a sale's waiting room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueStatus {
    pub standing: Standing,
    pub queue: QueueState,
    /// When joining opens, and when the draw happens (the sale's start).
    pub opens_at: DateTime<Utc>,
    pub starts_at: DateTime<Utc>,
    /// The seed's SHA-256, published from the room's opening: a joiner
    /// keeps it to hold the shop to its draw.
    pub commitment: Option<SeedCommitment>,
    /// The frozen pre-queue's SHA-256, published at the start before the seed.
    pub entries_commitment: Option<EntriesCommitment>,
    pub ticket: Option<Ticket>,
    /// 1-based place in the line, once drawn (late places: at once).
    pub position: Option<i64>,
    /// Places before this one not admitted yet.
    pub ahead: Option<i64>,
    /// Shoppers before this place who hold a pass right now (and with it
    /// units): the reason "nobody waiting ahead" does not mean "your turn".
    pub admitted_ahead: Option<i64>,
    /// Units nobody holds: the stock less what open passes cover.
    pub units_left: i64,
    /// Units held by open passes and unpaid orders.
    pub held: i64,
    /// The latest a held unit can come back if it is not paid for: a pass
    /// used at its grace's last second (`PASS_GRACE` after its deadline)
    /// starts an order with the full time to pay.
    pub held_until: Option<DateTime<Utc>>,
    /// The earliest a held unit can come back (its pass runs out or its
    /// order's time to pay does).
    pub next_release_at: Option<DateTime<Utc>>,
    pub pass: Option<PassRef>,
    pub pass_state: Option<PassState>,
    pub pass_expires_at: Option<DateTime<Utc>>,
    /// Units the pass covers: min(limit, units free when it was issued).
    pub pass_units: Option<i32>,
    /// How long this place may wait, and what that rests on.
    pub wait: WaitEstimate,
    /// How long a pass lets its holder buy (`QUEUE_PASS_SECS`), so waiters
    /// know before their turn how long they will have.
    pub pass_length: Duration,
}

/// A waiter's estimated wait, from the units free, the times held units
/// come back, and the rate places have been admitted at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitEstimate {
    /// Not waiting in a drawn line, or nothing to go by yet.
    Unknown,
    /// Units are free for everyone ahead and this place: admitted within moments.
    UnitsFree,
    /// Every unit this place needs is held: the turn comes no sooner than
    /// `at` (when enough held units come back if their holders do not buy);
    /// `wait` is that, or the admission rate's figure when longer.
    AfterHeldReturn { at: DateTime<Utc>, wait: Duration },
    /// More shoppers are ahead than units are free or held: the turn comes
    /// only if paid orders are refunded or stock is added.
    OnlyIfReturned,
}

impl WaitEstimate {
    /// The wait in seconds, where it can be told.
    pub fn seconds(&self) -> Option<u64> {
        match self {
            WaitEstimate::UnitsFree => Some(0),
            WaitEstimate::AfterHeldReturn { wait, .. } => Some(wait.as_secs()),
            WaitEstimate::Unknown | WaitEstimate::OnlyIfReturned => None,
        }
    }
}

/// `ahead` places wait before this one: it is admitted once `ahead + 1`
/// passes can be issued, each needing at least a unit.
fn estimate_wait(room: &RoomSnapshot, ahead: i64, now: DateTime<Utc>) -> WaitEstimate {
    let needed = ahead + 1;
    let units = room.units_free();
    if units >= needed {
        return WaitEstimate::UnitsFree;
    }
    let by_rate = room
        .admission_rate()
        .map(|rate| Duration::from_secs_f64(needed as f64 / rate));
    match room.released_by(needed - units) {
        Some(at) => {
            let until = (at - now).to_std().unwrap_or_default();
            WaitEstimate::AfterHeldReturn {
                at,
                wait: by_rate.map_or(until, |rate| rate.max(until)),
            }
        }
        None => WaitEstimate::OnlyIfReturned,
    }
}

/// `customer`'s standing (None: signed out, `NotJoined`).
pub async fn status(
    shop: &Shop,
    customer: Option<CustomerId>,
    product: ProductId,
) -> Result<QueueStatus, AppError> {
    let sale = queue_sale(shop, product).await?;
    let room = snapshot(shop, product).await?;
    // A room another instance opened a moment ago may not be in this
    // snapshot yet: past its opening, the customer's place is read anyway.
    let place = match customer {
        Some(customer) if room.opened || sale.is_open(room.db_now) => {
            place_of(shop, &room, product, customer).await?
        }
        _ => None,
    };
    let position = place.as_ref().and_then(|p| p.position);
    let pass = match (customer, position) {
        (Some(customer), Some(position)) => pass_of(shop, &room, product, customer, position)
            .await?
            .map(|(number, state, expires_at, units)| {
                let pass = place.as_ref().map(|p| PassRef {
                    ticket: p.ticket.clone(),
                    number,
                });
                (pass, state, expires_at, units)
            }),
        _ => None,
    };
    let queue = queue_state(&room);
    let pass_state = pass.as_ref().map(|(_, state, _, _)| *state);
    let standing = standing_of(queue, place.is_some(), pass_state);
    let ahead = position
        .filter(|_| standing == Standing::Waiting && room.drawn)
        .map(|position| (position - room.admitted - 1).max(0));
    let admitted_ahead = ahead.map(|_| room.open_passes.len() as i64);
    let held = room.open_units + room.unpaid_units;
    let time_to_pay = chrono::Duration::from_std(shop.settings.payment_timeout)
        .unwrap_or_else(|_| chrono::Duration::minutes(10));
    let next_release_at = room.next_release().filter(|_| held > 0);
    let held_until = room.held_until(time_to_pay).filter(|_| held > 0);
    let wait = match ahead {
        Some(ahead) => estimate_wait(&room, ahead, room.db_now),
        None => WaitEstimate::Unknown,
    };
    Ok(QueueStatus {
        standing,
        queue,
        opens_at: sale.opens_at,
        starts_at: sale.starts_at,
        commitment: room.commitment,
        entries_commitment: room.entries_commitment,
        ticket: place.map(|p| p.ticket),
        position,
        ahead,
        admitted_ahead,
        units_left: room.units_free(),
        held,
        held_until,
        next_release_at,
        pass: pass.as_ref().and_then(|(pass, _, _, _)| pass.clone()),
        pass_state,
        pass_expires_at: pass.as_ref().map(|(_, _, at, _)| *at),
        pass_units: pass.as_ref().map(|(_, _, _, units)| *units),
        wait,
        pass_length: shop.settings.queue_pass,
    })
}

/// A pass as a customer sees it: number, state, deadline, units.
type PassSeen = (i32, PassState, DateTime<Utc>, i32);

/// The customer's pass, if their position was admitted: open as the room
/// shows it, else what became of it.
async fn pass_of(
    shop: &Shop,
    room: &RoomSnapshot,
    product: ProductId,
    customer: CustomerId,
    position: i64,
) -> Result<Option<PassSeen>, AppError> {
    if let Some(open) = room.open_passes.get(&customer) {
        return Ok(Some((
            open.number,
            PassState::Issued,
            open.expires_at,
            open.units,
        )));
    }
    if position > room.admitted {
        return Ok(None);
    }
    Ok(ended_pass_of(shop, product, customer)
        .await?
        .map(|row| (row.number, row.state, row.expires_at, row.units)))
}

fn queue_state(room: &RoomSnapshot) -> QueueState {
    if room.ended {
        QueueState::Closed
    } else if !room.frozen {
        QueueState::Pre
    } else if room.sold_out() {
        QueueState::SoldOut
    } else if room.paused {
        QueueState::Paused
    } else {
        QueueState::Open
    }
}

fn standing_of(queue: QueueState, joined: bool, pass: Option<PassState>) -> Standing {
    if queue == QueueState::Closed {
        return Standing::Closed;
    }
    match pass {
        Some(PassState::Issued) => return Standing::Admitted,
        Some(PassState::Used | PassState::Lapsed) => return Standing::Closed,
        None => {}
    }
    match (queue, joined) {
        (QueueState::SoldOut, _) => Standing::SoldOut,
        (_, true) => Standing::Waiting,
        (_, false) => Standing::NotJoined,
    }
}

/// What the sale alone says before its room opens.
pub fn before_opening(shop: &Shop, sale: &QueueSale, units_left: i64) -> QueueStatus {
    QueueStatus {
        standing: Standing::NotJoined,
        queue: QueueState::Pre,
        opens_at: sale.opens_at,
        starts_at: sale.starts_at,
        commitment: None,
        entries_commitment: None,
        ticket: None,
        position: None,
        ahead: None,
        admitted_ahead: None,
        units_left,
        held: 0,
        held_until: None,
        next_release_at: None,
        pass: None,
        pass_state: None,
        pass_expires_at: None,
        pass_units: None,
        wait: WaitEstimate::Unknown,
        pass_length: shop.settings.queue_pass,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spent_turn_outranks_how_the_room_ended() {
        assert_eq!(
            standing_of(QueueState::SoldOut, true, Some(PassState::Used)),
            Standing::Closed
        );
        assert_eq!(
            standing_of(QueueState::SoldOut, true, None),
            Standing::SoldOut
        );
        assert_eq!(
            standing_of(QueueState::Open, true, Some(PassState::Issued)),
            Standing::Admitted
        );
        assert_eq!(
            standing_of(QueueState::Closed, true, Some(PassState::Issued)),
            Standing::Closed
        );
        assert_eq!(
            standing_of(QueueState::Pre, false, None),
            Standing::NotJoined
        );
    }
}
