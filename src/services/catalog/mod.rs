//! Flash-sale products: creating them and reading them for the shop pages.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use diesel::prelude::*;

use crate::config::MAX_CHECK_WORK;
use crate::db::models::NewProduct;
use crate::db::schema::products;
use crate::db::{self, PgPool};
use crate::domain::{check_plain_text, CustomerId, InvalidInput, Lines, Money, Product, ProductId};
use crate::error::{AppError, Conflict, FrozenTerm, Missing, StrandingEdit};
use crate::services::action_log::{self, ActionKind, AdminAction};
use crate::services::{sale_cache, Shop};
use changes::{audit_time, changes};

mod changes;

/// A flash sale as an admin describes it, already checked.
#[derive(Debug, Clone)]
pub struct SaleSpec {
    pub name: String,
    pub description: String,
    pub price: Money,
    pub stock: i32,
    pub per_customer_limit: Option<i32>,
    pub starts_at: DateTime<Utc>,
    pub ends_at: Option<DateTime<Utc>>,
    /// Customers wait in the waiting room and buy with a pass (issue #16).
    pub queue_mode: bool,
    /// When the waiting room opens; None: `QUEUE_OPENS_BEFORE_START` before
    /// the start. Only with `queue_mode`.
    pub queue_opens_at: Option<DateTime<Utc>>,
    /// The size of the bot check for joining the waiting room: the tries a
    /// browser makes on average (`services::door`).
    pub join_check_work: i32,
}

/// A new sale's bot check unless the admin sets another (`JOIN_CHECK_WORK`).
pub const DEFAULT_JOIN_CHECK_WORK: i32 = 2_000;

/// The most units a sale may hold; keeps every stock sum far from `i32::MAX`.
pub const MAX_STOCK: i32 = 10_000_000;

impl SaleSpec {
    /// A sale as it stands (its current stock), for the edit form.
    pub fn of(product: &Product) -> SaleSpec {
        SaleSpec {
            name: product.name.clone(),
            description: product.description.clone(),
            price: product.price(),
            stock: product.stock,
            per_customer_limit: product.per_customer_limit,
            starts_at: product.sale_starts_at,
            ends_at: product.sale_ends_at,
            queue_mode: product.queue_mode,
            queue_opens_at: product.queue_opens_at,
            join_check_work: product.join_check_work,
        }
    }

    pub fn validate(self) -> Result<SaleSpec, InvalidInput> {
        if !(0..=MAX_STOCK).contains(&self.stock) {
            return Err(InvalidInput::StockOutOfBounds { max: MAX_STOCK });
        }
        let terms = SaleTerms {
            name: self.name,
            description: self.description,
            price: self.price,
            per_customer_limit: self.per_customer_limit,
            starts_at: self.starts_at,
            ends_at: self.ends_at,
            queue_mode: self.queue_mode,
            queue_opens_at: self.queue_opens_at,
            join_check_work: self.join_check_work,
        }
        .validate()?;
        Ok(SaleSpec {
            name: terms.name,
            description: terms.description,
            ..self
        })
    }
}

/// Everything about a sale an admin may edit in place. Stock is not here:
/// it only changes through a recorded adjustment, so the ledger stays whole.
#[derive(Debug, Clone)]
pub struct SaleTerms {
    pub name: String,
    pub description: String,
    pub price: Money,
    pub per_customer_limit: Option<i32>,
    pub starts_at: DateTime<Utc>,
    pub ends_at: Option<DateTime<Utc>>,
    pub queue_mode: bool,
    pub queue_opens_at: Option<DateTime<Utc>>,
    pub join_check_work: i32,
}

/// How long before the start a waiting room opens unless told otherwise.
pub const QUEUE_OPENS_BEFORE_START: chrono::Duration = chrono::Duration::minutes(15);

/// When a sale's waiting room opens (`queue_opens_at`, or the default
/// before `starts_at`).
pub fn queue_opening(
    starts_at: DateTime<Utc>,
    queue_opens_at: Option<DateTime<Utc>>,
) -> DateTime<Utc> {
    queue_opens_at.unwrap_or(starts_at - QUEUE_OPENS_BEFORE_START)
}

impl SaleTerms {
    pub fn validate(self) -> Result<SaleTerms, InvalidInput> {
        let name = self.name.trim().to_string();
        if name.is_empty() || name.chars().count() > MAX_NAME_CHARS {
            return Err(InvalidInput::NameLength {
                max: MAX_NAME_CHARS,
            });
        }
        check_plain_text(&name, crate::domain::TextField::ProductName, Lines::One)?;
        check_plain_text(
            &self.description,
            crate::domain::TextField::Description,
            Lines::Many,
        )?;
        if self.description.chars().count() > MAX_DESCRIPTION_CHARS {
            return Err(InvalidInput::DescriptionTooLong {
                max: MAX_DESCRIPTION_CHARS,
            });
        }
        if self.per_customer_limit.is_some_and(|l| l < 1) {
            return Err(InvalidInput::LimitBelowOne);
        }
        if self.ends_at.is_some_and(|end| end <= self.starts_at) {
            return Err(InvalidInput::EndsBeforeStart);
        }
        if !(1..=MAX_CHECK_WORK).contains(&self.join_check_work) {
            return Err(InvalidInput::CheckWorkOutOfBounds {
                max: MAX_CHECK_WORK,
            });
        }
        if self.queue_mode && self.per_customer_limit.is_none() {
            return Err(InvalidInput::QueueNeedsLimit);
        }
        match self.queue_opens_at {
            Some(_) if !self.queue_mode => return Err(InvalidInput::OpeningWithoutQueue),
            Some(opens) if opens > self.starts_at => {
                return Err(InvalidInput::QueueOpensAfterStart)
            }
            _ => {}
        }
        Ok(SaleTerms {
            name,
            description: self.description.trim().to_string(),
            ..self
        })
    }
}

/// The longest product name, in characters.
pub const MAX_NAME_CHARS: usize = 200;
/// A description must stay under this many characters.
pub const MAX_DESCRIPTION_CHARS: usize = 5_000;

/// The products table's own checks, should a sale reach them past
/// `validate` (another writer, a race with a concurrent edit): the admin's
/// mistake, said as such, not a server error.
fn refused_by_constraint(error: diesel::result::Error) -> AppError {
    use diesel::result::{DatabaseErrorKind, Error};
    if let Error::DatabaseError(DatabaseErrorKind::CheckViolation, info) = &error {
        let invalid = match info.constraint_name() {
            Some("products_queue_needs_limit") => Some(InvalidInput::QueueNeedsLimit),
            Some("products_queue_opens_before_start") => Some(InvalidInput::QueueOpensAfterStart),
            _ => None,
        };
        if let Some(invalid) = invalid {
            return invalid.into();
        }
    }
    error.into()
}

pub async fn create_product(pool: &PgPool, spec: SaleSpec) -> Result<Product, AppError> {
    insert_sale(pool, spec, None).await
}

/// An admin's new sale: the product and its audit record commit together.
pub async fn create_sale_by(
    pool: &PgPool,
    spec: SaleSpec,
    admin: CustomerId,
) -> Result<Product, AppError> {
    insert_sale(pool, spec, Some(admin)).await
}

async fn insert_sale(
    pool: &PgPool,
    spec: SaleSpec,
    admin: Option<CustomerId>,
) -> Result<Product, AppError> {
    let spec = spec.validate()?;
    let inserted = db::run(pool, move |conn| {
        conn.transaction(|conn| {
            let product = diesel::insert_into(products::table)
                .values(NewProduct {
                    name: &spec.name,
                    description: &spec.description,
                    price_cents: spec.price.cents(),
                    stock: spec.stock,
                    initial_stock: spec.stock,
                    per_customer_limit: spec.per_customer_limit,
                    sale_starts_at: spec.starts_at,
                    sale_ends_at: spec.ends_at,
                    queue_mode: spec.queue_mode,
                    queue_opens_at: spec.queue_opens_at,
                    join_check_work: spec.join_check_work,
                })
                .returning(Product::as_returning())
                .get_result(conn)
                .map_err(refused_by_constraint)?;
            if let Some(admin) = admin {
                let mut detail = format!("“{}”: {} units at {}", spec.name, spec.stock, spec.price);
                if spec.queue_mode {
                    detail.push_str("; queue mode, opens ");
                    detail.push_str(&audit_time(Some(queue_opening(
                        spec.starts_at,
                        spec.queue_opens_at,
                    ))));
                }
                let action = AdminAction::on_product(
                    admin,
                    ActionKind::SaleCreate,
                    product.product_id(),
                    detail,
                );
                action_log::record(conn, &action)?;
            }
            Ok(product)
        })
    })
    .await;
    // Even after an error: the commit may have gone through unanswered.
    sale_cache::invalidate();
    inserted
}

/// Rewrites a sale's terms (not its stock: that goes through adjustments),
/// recording what changed and who changed it in the same transaction, then
/// brings the stock gate's copy of the limit up to date. The row lock makes
/// a purchase in flight finish at the old price before the new one applies,
/// never a mix of both.
pub async fn update_sale(
    shop: &Shop,
    id: ProductId,
    terms: SaleTerms,
    admin: CustomerId,
) -> Result<Product, AppError> {
    let terms = terms.validate()?;
    let updated = db::run(&shop.pool, move |conn| {
        conn.transaction(|conn| {
            let before: Product = products::table
                .find(id.get())
                .for_update()
                .select(Product::as_select())
                .first(conn)
                .optional()?
                .ok_or_else(|| no_such_product(id))?;
            keeps_the_queue_whole(conn, &before, &terms)?;
            let after = diesel::update(products::table.find(id.get()))
                .set((
                    products::name.eq(&terms.name),
                    products::description.eq(&terms.description),
                    products::price_cents.eq(terms.price.cents()),
                    products::per_customer_limit.eq(terms.per_customer_limit),
                    products::sale_starts_at.eq(terms.starts_at),
                    products::sale_ends_at.eq(terms.ends_at),
                    products::queue_mode.eq(terms.queue_mode),
                    products::queue_opens_at.eq(terms.queue_opens_at),
                    products::join_check_work.eq(terms.join_check_work),
                    products::updated_at.eq(Utc::now()),
                ))
                .returning(Product::as_returning())
                .get_result(conn)
                .map_err(refused_by_constraint)?;
            let action =
                AdminAction::on_product(admin, ActionKind::SaleEdit, id, changes(&before, &terms));
            action_log::record(conn, &action)?;
            Ok(after)
        })
    })
    .await;
    sale_cache::invalidate();
    let product = updated?;
    if let Err(error) = super::stock_gate::resync(shop, id).await {
        tracing::warn!(%id, %error, "sale updated, but the stock gate could not be resynced; reconcile will do it");
    }
    Ok(product)
}

/// Refuses an edit that would break a waiting room customers are already
/// in. Once the draw is published (`drawn_at`), its record is checked
/// against the sale's start (the `late` flags) and the passes cover the
/// per-customer limit, so mode, opening, start and limit are fixed. Before
/// the draw, entries pin what they joined: the sale stays in queue mode, the
/// opening stays at or before the first join, and the start stays after the
/// last one (so every pre-queue entry is still "before the start").
fn keeps_the_queue_whole(
    conn: &mut db::PgConn,
    before: &Product,
    after: &SaleTerms,
) -> Result<(), AppError> {
    use crate::db::schema::{queue_draws, queue_entries};
    use diesel::dsl::{max, min};
    if !before.queue_mode {
        return Ok(());
    }
    // The room's lock alone, as the freeze takes it: no join is writing a
    // place while the times it is judged by change, and a room frozen
    // meanwhile is seen frozen.
    crate::services::waiting_room::hold_room(conn, before.product_id())?;
    let drawn_at: Option<DateTime<Utc>> = queue_draws::table
        .find(before.id)
        .select(queue_draws::frozen_at)
        .first::<Option<DateTime<Utc>>>(conn)
        .optional()?
        .flatten();
    let opening_before = queue_opening(before.sale_starts_at, before.queue_opens_at);
    let opening_after = queue_opening(after.starts_at, after.queue_opens_at);
    if let Some(drawn_at) = drawn_at {
        let moved = if !after.queue_mode {
            Some(FrozenTerm::QueueMode)
        } else if after.starts_at != before.sale_starts_at {
            Some(FrozenTerm::Start)
        } else if opening_after != opening_before {
            Some(FrozenTerm::Opening)
        } else if after.per_customer_limit != before.per_customer_limit {
            Some(FrozenTerm::Limit)
        } else {
            None
        };
        if let Some(change) = moved {
            return Err(Conflict::DrawPublished {
                frozen_at: drawn_at,
                change,
            }
            .into());
        }
        return Ok(());
    }
    let (entries, first, last): (i64, Option<DateTime<Utc>>, Option<DateTime<Utc>>) =
        queue_entries::table
            .filter(queue_entries::product_id.eq(before.id))
            .select((
                diesel::dsl::count_star(),
                min(queue_entries::joined_at),
                max(queue_entries::joined_at),
            ))
            .first(conn)?;
    let (Some(first), Some(last)) = (first, last) else {
        return Ok(());
    };
    let refusal = if !after.queue_mode {
        Some(StrandingEdit::LeaveQueueMode)
    } else if opening_after > first {
        Some(StrandingEdit::OpenLater {
            first_joined: first,
        })
    } else if after.starts_at <= last {
        Some(StrandingEdit::StartTooEarly { last_joined: last })
    } else {
        None
    };
    match refusal {
        Some(edit) => Err(Conflict::CustomersWaiting {
            people: entries,
            edit,
        }
        .into()),
        None => Ok(()),
    }
}

/// Every product, read fresh from Postgres (not the sale cache's copy).
pub async fn list_products(pool: &PgPool) -> Result<Vec<Product>, AppError> {
    sale_cache::load_products(pool).await
}

pub async fn find_product(pool: &PgPool, id: ProductId) -> Result<Product, AppError> {
    db::run(pool, move |conn| {
        products::table
            .find(id.get())
            .select(Product::as_select())
            .first(conn)
            .optional()?
            .ok_or_else(|| no_such_product(id))
    })
    .await
}

fn no_such_product(id: ProductId) -> AppError {
    AppError::NotFound(Missing::Product(id))
}

/// A sale as the shop pages show it: its row from the sale cache (at most
/// `sale_cache::SERVE_AT_MOST` old) and the units left as the stock gate
/// counts them at this moment.
pub struct ShownSale {
    pub product: Arc<Product>,
    pub units_left: i32,
}

/// Every sale for the sale list, without a Postgres read per view.
pub async fn sales_on_show(shop: &Shop) -> Result<Vec<ShownSale>, AppError> {
    let shelf = shop.sale_cache.shelf(&shop.pool).await?;
    Ok(with_units_left(shop, shelf.products(), shelf.products()).await)
}

/// One sale for its product page; an id the cache lacks is not a product,
/// so a crowd asking for one costs Postgres nothing either.
pub async fn sale_on_show(shop: &Shop, id: ProductId) -> Result<ShownSale, AppError> {
    let shelf = shop.sale_cache.shelf(&shop.pool).await?;
    let product = shelf.product(id).ok_or_else(|| no_such_product(id))?;
    let mut shown = with_units_left(shop, shelf.products(), std::slice::from_ref(product)).await;
    shown.pop().ok_or_else(|| no_such_product(id))
}

/// Units left from the gate's counts (read for the whole list at once, a few
/// times a second at most), which buyers change without touching the cached
/// rows; the cached stock where the gate is off, does not know the product,
/// or has not answered lately.
async fn with_units_left(
    shop: &Shop,
    every: &[Arc<Product>],
    products: &[Arc<Product>],
) -> Vec<ShownSale> {
    let counted = match &shop.gate {
        Some(gate) => shop.units_left.counts(gate, every, products).await,
        None => vec![None; products.len()],
    };
    products
        .iter()
        .zip(counted)
        .map(|(product, gate_stock)| ShownSale {
            product: product.clone(),
            units_left: gate_stock.map_or(product.stock, |units| {
                units.clamp(0, i64::from(i32::MAX)) as i32
            }),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use diesel::result::{DatabaseErrorInformation, DatabaseErrorKind, Error};

    use super::*;
    use crate::error::Invalid;

    struct Violated(&'static str);

    impl DatabaseErrorInformation for Violated {
        fn message(&self) -> &str {
            "new row for relation \"products\" violates check constraint"
        }
        fn details(&self) -> Option<&str> {
            None
        }
        fn hint(&self) -> Option<&str> {
            None
        }
        fn table_name(&self) -> Option<&str> {
            Some("products")
        }
        fn column_name(&self) -> Option<&str> {
            None
        }
        fn constraint_name(&self) -> Option<&str> {
            Some(self.0)
        }
        fn statement_position(&self) -> Option<i32> {
            None
        }
    }

    fn violating(constraint: &'static str) -> AppError {
        refused_by_constraint(Error::DatabaseError(
            DatabaseErrorKind::CheckViolation,
            Box::new(Violated(constraint)),
        ))
    }

    #[test]
    fn the_queue_checks_of_the_products_table_are_the_admins_mistakes() {
        assert!(matches!(
            violating("products_queue_needs_limit"),
            AppError::Invalid(Invalid::Input(InvalidInput::QueueNeedsLimit))
        ));
        assert!(matches!(
            violating("products_queue_opens_before_start"),
            AppError::Invalid(Invalid::Input(InvalidInput::QueueOpensAfterStart))
        ));
        assert!(matches!(
            violating("some_other_check"),
            AppError::Internal(_)
        ));
    }

    fn terms(queue_mode: bool, limit: Option<i32>, opens: Option<i64>) -> SaleTerms {
        let starts_at = DateTime::from_timestamp(1_900_000_000, 0).unwrap();
        SaleTerms {
            name: "Drop".into(),
            description: String::new(),
            price: Money::from_cents(100).unwrap(),
            per_customer_limit: limit,
            starts_at,
            ends_at: None,
            queue_mode,
            queue_opens_at: opens.map(|minutes| starts_at + chrono::Duration::minutes(minutes)),
            join_check_work: DEFAULT_JOIN_CHECK_WORK,
        }
    }

    #[test]
    fn a_queue_needs_a_limit_and_opens_at_or_before_the_start() {
        assert!(terms(true, Some(1), None).validate().is_ok());
        assert!(terms(true, Some(1), Some(0)).validate().is_ok());
        assert!(terms(true, Some(1), Some(-60)).validate().is_ok());
        let refusal = |t: SaleTerms| t.validate().unwrap_err();
        assert_eq!(
            refusal(terms(true, None, None)),
            InvalidInput::QueueNeedsLimit
        );
        assert_eq!(
            refusal(terms(true, Some(1), Some(1))),
            InvalidInput::QueueOpensAfterStart
        );
        assert_eq!(
            refusal(terms(false, Some(1), Some(-60))),
            InvalidInput::OpeningWithoutQueue
        );
    }
}
