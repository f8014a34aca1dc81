//! The SQL the handlers run, for PostgreSQL, SQLite and MySQL.
//!
//! The statements are the same text for PostgreSQL and SQLite (`$N` placeholders work in each);
//! MySQL numbers its `?` by position, so it gets its own [`Statements`]. Only PostgreSQL has the
//! outbox (`Config::outbox`). Only the SQL text and the
//! sqlx types differ, so one macro writes every implementation. The idempotency layer itself is
//! built in plain view, once per database, in `postgres_app`, `sqlite_app` and `mysql_app`
//! (lib.rs).
//!
//! Why not one runtime-chosen store (`tower_idempotency::store::DynStore`, used by
//! [`crate::sweeper`])? Transactional mode hands the handler a transaction of the database's own
//! type (`IdempotencyTransaction<Postgres>` or `<Sqlite>`), so the handlers, and the layer in
//! front of them, are generic over the database; this trait is that generic path.

use std::future::Future;

use serde::{Deserialize, Serialize};
use sqlx::{Pool, Row};
use tower_idempotency::{
    store::{mysql::MySqlStore, postgres::PostgresStore, sqlite::SqliteStore, TransactionalStore},
    IdempotencyTransaction,
};

/// The most orders `GET /orders?customerId=` returns.
pub(crate) const LIST_LIMIT: i64 = 1000;

/// The statements of one SQL dialect; each binds its parameters in the same order.
struct Statements {
    insert_order: &'static str,
    /// `None` where the database has no outbox table (only PostgreSQL has one).
    insert_event: Option<&'static str>,
    find_order: &'static str,
    orders_of: &'static str,
}

/// PostgreSQL: `$N` placeholders, and the outbox.
const POSTGRES: Statements = Statements {
    insert_event: Some(
        "INSERT INTO outbox (event_id, kind, payload) VALUES ($1, 'order.created', $2::jsonb)",
    ),
    ..NUMBERED
};

/// SQLite (and PostgreSQL's other statements): `$N` placeholders.
const NUMBERED: Statements = Statements {
    insert_event: None,
    insert_order:
        "INSERT INTO orders (order_id, customer_id, total_cents, status) VALUES ($1, $2, $3, $4)",
    find_order: "SELECT order_id, customer_id, total_cents, status FROM orders WHERE order_id = $1",
    orders_of: "SELECT order_id, customer_id, total_cents, status FROM orders \
         WHERE customer_id = $1 ORDER BY created_at, order_id LIMIT $2",
};

/// An order, as stored and as answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Order {
    /// A UUID string chosen by the server.
    pub order_id: String,
    /// Who placed it.
    pub customer_id: String,
    /// The amount, in cents, at least 1.
    pub total_cents: i64,
    /// `pending` on creation.
    pub status: String,
}

/// MySQL: positional `?` placeholders, in the same order. Its `utf8mb4_bin` compares with
/// trailing spaces ignored (a PAD SPACE collation), so `orders_of` also compares lengths: `c_1`
/// and `c_1 ` are two customers, as on the other databases.
const POSITIONAL: Statements = Statements {
    insert_event: None,
    insert_order:
        "INSERT INTO orders (order_id, customer_id, total_cents, status) VALUES (?, ?, ?, ?)",
    find_order: "SELECT order_id, customer_id, total_cents, status FROM orders WHERE order_id = ?",
    orders_of: "SELECT o.order_id, o.customer_id, o.total_cents, o.status \
         FROM orders o JOIN (SELECT ? AS customer_id) wanted \
         ON o.customer_id = wanted.customer_id \
         AND CHAR_LENGTH(o.customer_id) = CHAR_LENGTH(wanted.customer_id) \
         ORDER BY o.created_at, o.order_id LIMIT ?",
};

const PING: &str = "SELECT 1";

/// A database the orders API runs on: its idempotency store and its queries.
pub(crate) trait Backend: sqlx::Database {
    /// The idempotency store on this database.
    type Store: TransactionalStore<Database = Self>;

    /// Insert `order` inside the idempotency transaction (begun here, on first use), and with
    /// `outbox` its `order.created` event too, in the same transaction.
    fn insert_order(
        tx: &IdempotencyTransaction<Self>,
        order: &Order,
        outbox: bool,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// The order with this id.
    fn find_order(
        pool: &Pool<Self>,
        order_id: &str,
    ) -> impl Future<Output = Result<Option<Order>, sqlx::Error>> + Send;

    /// The orders of a customer, oldest first, at most [`LIST_LIMIT`].
    fn orders_of(
        pool: &Pool<Self>,
        customer_id: &str,
    ) -> impl Future<Output = Result<Vec<Order>, sqlx::Error>> + Send;

    /// `SELECT 1`.
    fn ping(pool: &Pool<Self>) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
}

macro_rules! backend {
    ($db:ty, $store:ty, $row:ty, $sql:expr) => {
        impl Backend for $db {
            type Store = $store;

            async fn insert_order(
                tx: &IdempotencyTransaction<Self>,
                order: &Order,
                outbox: bool,
            ) -> Result<(), sqlx::Error> {
                let mut tx = tx.begin().await?;
                sqlx::query($sql.insert_order)
                    .bind(&order.order_id)
                    .bind(&order.customer_id)
                    .bind(order.total_cents)
                    .bind(&order.status)
                    .execute(&mut *tx)
                    .await?;
                if outbox {
                    let insert_event = $sql.insert_event.ok_or_else(|| {
                        sqlx::Error::Configuration("the outbox is PostgreSQL's only".into())
                    })?;
                    sqlx::query(insert_event)
                        .bind(&order.order_id)
                        .bind(order_created(order))
                        .execute(&mut *tx)
                        .await?;
                }
                Ok(())
            }

            async fn find_order(
                pool: &Pool<Self>,
                order_id: &str,
            ) -> Result<Option<Order>, sqlx::Error> {
                let row = sqlx::query($sql.find_order)
                    .bind(order_id)
                    .fetch_optional(pool)
                    .await?;
                row.as_ref().map(order_from_row).transpose()
            }

            async fn orders_of(
                pool: &Pool<Self>,
                customer_id: &str,
            ) -> Result<Vec<Order>, sqlx::Error> {
                let rows = sqlx::query($sql.orders_of)
                    .bind(customer_id)
                    .bind(LIST_LIMIT)
                    .fetch_all(pool)
                    .await?;
                rows.iter().map(order_from_row).collect()
            }

            async fn ping(pool: &Pool<Self>) -> Result<(), sqlx::Error> {
                sqlx::query(PING).execute(pool).await.map(drop)
            }
        }

        impl OrderRow for $row {
            fn order(&self) -> Result<Order, sqlx::Error> {
                Ok(Order {
                    order_id: self.try_get("order_id")?,
                    customer_id: self.try_get("customer_id")?,
                    total_cents: self.try_get("total_cents")?,
                    status: self.try_get("status")?,
                })
            }
        }
    };
}

/// The `order.created` event of `order`, as the outbox keeps it: its id is the order's.
fn order_created(order: &Order) -> String {
    serde_json::json!({
        "id": order.order_id,
        "orderId": order.order_id,
        "customerId": order.customer_id,
        "amountCents": order.total_cents,
    })
    .to_string()
}

/// Decoding an order from a row of either database.
trait OrderRow {
    fn order(&self) -> Result<Order, sqlx::Error>;
}

fn order_from_row(row: &impl OrderRow) -> Result<Order, sqlx::Error> {
    row.order()
}

backend!(
    sqlx::Postgres,
    PostgresStore,
    sqlx::postgres::PgRow,
    POSTGRES
);
backend!(sqlx::Sqlite, SqliteStore, sqlx::sqlite::SqliteRow, NUMBERED);
backend!(sqlx::MySql, MySqlStore, sqlx::mysql::MySqlRow, POSITIONAL);
