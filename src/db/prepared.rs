//! Hand-written SQL that each connection keeps prepared, as Diesel keeps
//! the statements its query builder makes.
//!
//! `diesel::sql_query` never lets its statement be cached (its text could
//! be built per call), so Postgres parses and plans it on every run. The
//! purchase's statements (a batch's `WRITE_SALES`, a cart's `WRITE_ORDER`,
//! the buyers' `HOLDERS` read) are fixed texts run inside the product's
//! lock hold, where their parsing and planning is time every buyer in line
//! waits; prepared, each is parsed once per connection and its plan kept
//! as long as the connection keeps plans (`db::PLANS_KEPT`). Every value
//! is bound, never spliced into the text.

use diesel::expression::AsExpression;
use diesel::expression::TypedExpressionType;
use diesel::pg::Pg;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::sql_types::{SingleValue, SqlType, Untyped};
use diesel::{QueryResult, RunQueryDsl};

/// A fixed SQL text with `$1`, `$2`, … placeholders, and their values.
/// Every `$` in the text is read as a placeholder (none may sit in a string
/// literal, a comment or a `$$` quote), and every value bound must be named.
pub struct Prepared {
    sql: &'static str,
    binds: Vec<Box<dyn QueryFragment<Pg> + Send>>,
}

impl Prepared {
    pub fn new(sql: &'static str) -> Prepared {
        Prepared {
            sql,
            binds: Vec::new(),
        }
    }

    /// The value of the next placeholder (`$1` first), as `ST`.
    pub fn bind<ST, T>(mut self, value: T) -> Prepared
    where
        ST: SqlType + TypedExpressionType + SingleValue,
        T: AsExpression<ST>,
        T::Expression: QueryFragment<Pg> + Send + 'static,
    {
        self.binds.push(Box::new(value.as_expression()));
        self
    }
}

impl QueryFragment<Pg> for Prepared {
    /// The text with each `$n` replaced by its value's bind: Diesel numbers
    /// the binds in the order they come, so a placeholder written twice is
    /// bound twice, and the text may name them in any order.
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        let mut rest = self.sql;
        let mut named = vec![false; self.binds.len()];
        while let Some(at) = rest.find('$') {
            let digits = rest[at + 1..]
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len() - at - 1);
            out.push_sql(&rest[..at]);
            let number: usize = rest[at + 1..at + 1 + digits].parse().map_err(|_| {
                diesel::result::Error::QueryBuilderError(
                    format!(
                        "a `$` not followed by a placeholder number in: {}",
                        self.sql
                    )
                    .into(),
                )
            })?;
            let bind = number
                .checked_sub(1)
                .and_then(|i| self.binds.get(i))
                .ok_or_else(|| {
                    diesel::result::Error::QueryBuilderError(
                        format!("no value bound for ${number}").into(),
                    )
                })?;
            bind.walk_ast(out.reborrow())?;
            named[number - 1] = true;
            rest = &rest[at + 1 + digits..];
        }
        if let Some(unnamed) = named.iter().position(|&named| !named) {
            return Err(diesel::result::Error::QueryBuilderError(
                format!("a value bound for ${} the text never names", unnamed + 1).into(),
            ));
        }
        out.push_sql(rest);
        Ok(())
    }
}

impl QueryId for Prepared {
    type QueryId = ();
    /// Not static: the cache keys it by its text and bind types.
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl Query for Prepared {
    type SqlType = Untyped;
}

impl<Conn> RunQueryDsl<Conn> for Prepared {}

#[cfg(test)]
mod tests {
    use super::*;
    use diesel::debug_query;
    use diesel::sql_types::{BigInt, Text};

    #[test]
    fn placeholders_are_bound_in_the_order_the_text_names_them() {
        let query =
            Prepared::new("SELECT $2::text, $1, $10 IS NULL, $1 + 1, $3, $4, $5, $6, $7, $8, $9")
                .bind::<BigInt, _>(7_i64)
                .bind::<Text, _>("two")
                .bind::<BigInt, _>(3_i64)
                .bind::<BigInt, _>(4_i64)
                .bind::<BigInt, _>(5_i64)
                .bind::<BigInt, _>(6_i64)
                .bind::<BigInt, _>(7_i64)
                .bind::<BigInt, _>(8_i64)
                .bind::<BigInt, _>(9_i64)
                .bind::<BigInt, _>(10_i64);
        let shown = debug_query::<Pg, _>(&query).to_string();
        assert!(
            shown.starts_with(
                "SELECT $1::text, $2, $3 IS NULL, $4 + 1, $5, $6, $7, $8, $9, $10, $11 -- binds: [\"two\", 7, 10, 7, 3, 4, 5, 6, 7, 8, 9]"
            ),
            "{shown}"
        );
    }

    #[test]
    fn a_value_the_text_never_names_is_an_error_not_a_statement() {
        let query = Prepared::new("SELECT $1, $3")
            .bind::<BigInt, _>(1_i64)
            .bind::<BigInt, _>(2_i64)
            .bind::<BigInt, _>(3_i64);
        let mut sql = diesel::pg::PgQueryBuilder::default();
        assert!(query.to_sql(&mut sql, &Pg).is_err());
    }

    #[test]
    fn a_placeholder_without_a_value_is_an_error_not_a_statement() {
        let query = Prepared::new("SELECT $2").bind::<BigInt, _>(1_i64);
        let mut sql = diesel::pg::PgQueryBuilder::default();
        assert!(query.to_sql(&mut sql, &Pg).is_err());
    }
}
