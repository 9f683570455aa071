//! What customers hold of a product: the units in their live orders
//! (awaiting payment or paid). The per-customer limit is checked against it
//! under the product lock, and the stock gate's per-customer counts are
//! rebuilt from it.

use std::collections::HashMap;

use diesel::prelude::*;

use super::schema::{order_items, orders};
use super::PgConn;
use crate::domain::{CustomerId, OrderStatus, ProductId};

/// Units of `product` in the live orders of each of `customers`, or of
/// every customer holding any when `customers` is None.
pub fn live_units(
    conn: &mut PgConn,
    product: ProductId,
    customers: Option<&[CustomerId]>,
) -> QueryResult<HashMap<CustomerId, i64>> {
    let live = [
        OrderStatus::AwaitingPayment.as_str(),
        OrderStatus::Paid.as_str(),
    ];
    let live_of_product = order_items::table
        .inner_join(orders::table)
        .filter(orders::status.eq_any(live))
        .filter(order_items::product_id.eq(product.get()));
    let units = (orders::customer_id, diesel::dsl::sum(order_items::quantity));
    let held: Vec<(i64, Option<i64>)> = match customers {
        Some(customers) => {
            let ids: Vec<i64> = customers.iter().map(|c| c.get()).collect();
            live_of_product
                .filter(orders::customer_id.eq_any(ids))
                .group_by(orders::customer_id)
                .select(units)
                .load(conn)?
        }
        None => live_of_product
            .group_by(orders::customer_id)
            .select(units)
            .load(conn)?,
    };
    Ok(held
        .into_iter()
        .map(|(customer, units)| (CustomerId(customer), units.unwrap_or(0)))
        .collect())
}
