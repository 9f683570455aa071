//! Reading orders for the order pages: the customer's own, and the admin's view.

use diesel::prelude::*;

use crate::db::schema::{customers, order_items, orders, payments, products, stock_history};
use crate::db::{self, PgPool};
use crate::domain::{
    CustomerId, Order, OrderId, OrderItem, OrderStatus, Payment, ProductId, StockChange,
};
use crate::error::{AppError, Missing};

#[derive(Debug, Clone)]
pub struct OrderLine {
    pub item: OrderItem,
    pub product_name: String,
}

#[derive(Debug, Clone)]
pub struct OrderDetail {
    pub order: Order,
    pub customer_email: String,
    pub lines: Vec<OrderLine>,
    pub payments: Vec<Payment>,
    pub history: Vec<StockChange>,
}

/// One order with its items, payments and ledger rows. `owner`, when given,
/// must own the order: anyone else gets the same 404 as for a missing order.
pub async fn order_detail(
    pool: &PgPool,
    order: OrderId,
    owner: Option<CustomerId>,
) -> Result<OrderDetail, AppError> {
    db::run(pool, move |conn| {
        let not_found = || AppError::NotFound(Missing::YourOrder(order));
        let (found, customer_email): (Order, String) = orders::table
            .inner_join(customers::table)
            .filter(orders::id.eq(order.get()))
            .select((Order::as_select(), customers::email))
            .first(conn)
            .optional()?
            .ok_or_else(not_found)?;
        if owner.is_some_and(|owner| owner.get() != found.customer_id) {
            return Err(not_found());
        }
        let lines = order_items::table
            .inner_join(products::table)
            .filter(order_items::order_id.eq(order.get()))
            .order(order_items::product_id.asc())
            .select((OrderItem::as_select(), products::name))
            .load::<(OrderItem, String)>(conn)?
            .into_iter()
            .map(|(item, product_name)| OrderLine { item, product_name })
            .collect();
        let payments = payments::table
            .filter(payments::order_id.eq(order.get()))
            .order(payments::id.asc())
            .select(Payment::as_select())
            .load(conn)?;
        let history = stock_history::table
            .filter(stock_history::order_id.eq(order.get()))
            .order(stock_history::id.asc())
            .select(StockChange::as_select())
            .load(conn)?;
        Ok(OrderDetail {
            order: found,
            customer_email,
            lines,
            payments,
            history,
        })
    })
    .await
}

/// One of a customer's orders, with what it bought (product names and
/// quantities), so a list of orders says what each one was.
#[derive(Debug, Clone)]
pub struct OrderSummary {
    pub order: Order,
    pub lines: Vec<(String, i32)>,
}

pub async fn orders_of(pool: &PgPool, customer: CustomerId) -> Result<Vec<OrderSummary>, AppError> {
    db::run(pool, move |conn| {
        let orders: Vec<Order> = orders::table
            .filter(orders::customer_id.eq(customer.get()))
            .order(orders::id.desc())
            .limit(200)
            .select(Order::as_select())
            .load(conn)?;
        let ids: Vec<i64> = orders.iter().map(|o| o.id).collect();
        let lines: Vec<(i64, String, i32)> = order_items::table
            .inner_join(products::table)
            .filter(order_items::order_id.eq_any(&ids))
            .order((order_items::order_id, order_items::product_id))
            .select((order_items::order_id, products::name, order_items::quantity))
            .load(conn)?;
        Ok(orders
            .into_iter()
            .map(|order| OrderSummary {
                lines: lines
                    .iter()
                    .filter(|(id, _, _)| *id == order.id)
                    .map(|(_, name, quantity)| (name.clone(), *quantity))
                    .collect(),
                order,
            })
            .collect())
    })
    .await
}

/// The admin's order list, newest first, with the buyer's email.
pub async fn recent_orders(pool: &PgPool, limit: i64) -> Result<Vec<(Order, String)>, AppError> {
    db::run(pool, move |conn| {
        Ok(orders::table
            .inner_join(customers::table)
            .order(orders::id.desc())
            .limit(limit)
            .select((Order::as_select(), customers::email))
            .load(conn)?)
    })
    .await
}

/// What the admin's order list is narrowed to; every part is optional.
#[derive(Debug, Clone, Default)]
pub struct OrderFilter {
    /// Part of the buyer's email, matched case-insensitively.
    pub email: Option<String>,
    pub status: Option<OrderStatus>,
    pub product: Option<ProductId>,
}

/// One page of the orders matching `filter`, newest first, with the buyer's
/// email, and how many match in all.
pub async fn search_orders(
    pool: &PgPool,
    filter: OrderFilter,
    offset: i64,
    limit: i64,
) -> Result<(Vec<(Order, String)>, i64), AppError> {
    db::run(pool, move |conn| {
        let query = || {
            let mut query = orders::table.inner_join(customers::table).into_boxed();
            if let Some(email) = &filter.email {
                query = query.filter(customers::email.ilike(like_pattern(email)));
            }
            if let Some(status) = filter.status {
                query = query.filter(orders::status.eq(status.as_str()));
            }
            if let Some(product) = filter.product {
                query = query.filter(
                    orders::id.eq_any(
                        order_items::table
                            .filter(order_items::product_id.eq(product.get()))
                            .select(order_items::order_id),
                    ),
                );
            }
            query
        };
        let rows = query()
            .order(orders::id.desc())
            .offset(offset)
            .limit(limit)
            .select((Order::as_select(), customers::email))
            .load(conn)?;
        let total = query().count().get_result(conn)?;
        Ok((rows, total))
    })
    .await
}

/// A LIKE pattern matching `text` anywhere, with LIKE's own wildcards taken literally.
fn like_pattern(text: &str) -> String {
    let mut pattern = String::with_capacity(text.len() + 2);
    pattern.push('%');
    for c in text.chars() {
        if matches!(c, '%' | '_' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push('%');
    pattern
}
