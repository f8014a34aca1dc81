//! The save written as one text statement, its values as literals.
//!
//! A statement list that saves and commits in one round trip (transactional mode on PostgreSQL
//! and SQLite) runs through the simple-query path, which binds no parameters, and so does MySQL's
//! save inside the handler's transaction (a text statement needs no prepare; see the MySQL
//! store). Every value is the layer's own bytes written in hex, the fencing token, or the status
//! as a number: no text from a request reaches the statement.

use crate::{
    key::{self, KeyHash},
    store::{
        record::{FencingToken, StoredResponse},
        sql::TableName,
    },
};

/// How a database spells the literals of the save.
pub(crate) struct Dialect {
    /// The key column as the statement names it (MySQL quotes `key`, a reserved word there).
    key_column: &'static str,
    /// A byte string written as a literal.
    bytes: fn(&mut String, &[u8]),
    /// The fencing token written as the literal of its column's type.
    token: fn(&mut String, FencingToken),
}

/// `X'..'` byte literals and the token as 16 bytes (MySQL quotes `key`).
#[cfg(feature = "mysql")]
pub(crate) const MYSQL: Dialect = Dialect {
    key_column: "`key`",
    bytes: push_x_quoted,
    token: push_token_bytes,
};

/// `X'..'` byte literals and the token as 16 bytes.
#[cfg(feature = "sqlite")]
pub(crate) const SQLITE: Dialect = Dialect {
    key_column: "key",
    bytes: push_x_quoted,
    token: push_token_bytes,
};

/// `decode('..', 'hex')` byte literals (which read the same whatever
/// `standard_conforming_strings` says) and the token as a `uuid`.
#[cfg(feature = "postgres")]
pub(crate) const POSTGRES: Dialect = Dialect {
    key_column: "key",
    bytes: |sql, bytes| {
        sql.push_str("decode('");
        key::push_hex(sql, bytes);
        sql.push_str("', 'hex')");
    },
    token: |sql, token| {
        sql.push('\'');
        sql.push_str(&token.as_uuid().hyphenated().to_string());
        sql.push_str("'::uuid");
    },
};

#[cfg(any(feature = "mysql", feature = "sqlite"))]
fn push_x_quoted(sql: &mut String, bytes: &[u8]) {
    // `X''` is the empty string, a valid empty body.
    sql.push_str("X'");
    key::push_hex(sql, bytes);
    sql.push('\'');
}

#[cfg(any(feature = "mysql", feature = "sqlite"))]
fn push_token_bytes(sql: &mut String, token: FencingToken) {
    push_x_quoted(sql, token.as_uuid().as_bytes());
}

/// The `UPDATE` that saves `response` on the running record of `key` held with `token` (its
/// expiry unchanged), in `dialect`, with `tail` after it (a `RETURNING` clause, or nothing).
pub(crate) fn complete(
    dialect: &Dialect,
    table: &TableName,
    key: &KeyHash,
    token: FencingToken,
    response: &StoredResponse,
    tail: &str,
) -> String {
    let headers = response.encode_headers();
    let capacity =
        200 + table.as_str().len() + tail.len() + 2 * (headers.len() + response.body.len());
    let mut sql = String::with_capacity(capacity);
    sql.push_str("UPDATE ");
    sql.push_str(table.as_str());
    sql.push_str(" SET state = 'done', status = ");
    sql.push_str(&response.status.as_u16().to_string());
    sql.push_str(", headers = ");
    (dialect.bytes)(&mut sql, &headers);
    sql.push_str(", body = ");
    (dialect.bytes)(&mut sql, &response.body);
    sql.push_str(" WHERE ");
    sql.push_str(dialect.key_column);
    sql.push_str(" = ");
    (dialect.bytes)(&mut sql, key.as_bytes());
    sql.push_str(" AND token = ");
    (dialect.token)(&mut sql, token);
    sql.push_str(" AND state = 'running'");
    sql.push_str(tail);
    sql
}

/// The largest saved body written into a statement as text: a larger
/// one is bound as parameters in a statement of its own, so the database parses no megabytes of
/// hex.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) const MAX_INLINE_RESPONSE: usize = 64 * 1024;

/// Whether `response` is small enough to be written into a statement (see
/// [`MAX_INLINE_RESPONSE`]).
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn fits_inline(response: &StoredResponse) -> bool {
    response.body.len() <= MAX_INLINE_RESPONSE
}
